//! [`DockerSandbox`]: one live container behind [`SandboxOps`]. Commands go through the
//! daemon (`exec.rs`); file requests are served from this host with
//! `openat2(RESOLVE_IN_ROOT)` under the container's root (`/proc/<init>/root`), by the same
//! code as the native init's, so a symlink planted inside never leads outside and nothing of
//! the container runs to answer them; reset recreates the container from its image,
//! snapshot commits it to an image and rollback recreates it from that image.

use super::backend::Spec;
use super::{exec, host, Client, DockerError};
use crate::backend::SandboxOps;
use crate::init::files;
use crate::protocol::{DirEntry, ExecRequest, ExecResult, FileStat, Health, Overview, Response};
use crate::SandboxError;
use bollard::query_parameters::{
    CommitContainerOptions, InspectContainerOptions, RemoveContainerOptions, RemoveImageOptions,
};
use std::os::fd::OwnedFd;

/// A live container. Dropping it removes the container and the images of its snapshots.
pub struct DockerSandbox {
    client: Client,
    spec: std::sync::Arc<Spec>,
    id: String,
    init_pid: i32,
    /// The keep-alive process (see `backend.rs`).
    keep_pid: i32,
    root: Option<OwnedFd>,
    /// Images committed by [`SandboxOps::snapshot`], by number; removed at reset and drop.
    snapshots: Vec<String>,
    /// The container's writable layer on this host (the daemon's `UpperDir`), asked once per
    /// container: `Some(None)` when the daemon names none.
    upper_dir: Option<Option<std::path::PathBuf>>,
    dead: bool,
}

impl std::fmt::Debug for DockerSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerSandbox")
            .field("id", &self.id)
            .field("init_pid", &self.init_pid)
            .field("dead", &self.dead)
            .finish()
    }
}

impl DockerSandbox {
    /// Create and start a container of `image` (the spec's, or a snapshot's).
    pub(crate) fn start(client: Client, spec: std::sync::Arc<Spec>) -> Result<Self, DockerError> {
        let image = spec.image.clone();
        let mut sb = Self {
            client,
            spec,
            id: String::new(),
            init_pid: 0,
            keep_pid: 0,
            root: None,
            snapshots: Vec::new(),
            upper_dir: None,
            dead: true,
        };
        sb.recreate(&image)?;
        Ok(sb)
    }

    /// The container's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Host pid of the container's init (its namespaces are those of every command).
    pub fn init_pid(&self) -> i32 {
        self.init_pid
    }

    /// Remove the current container (if any) and start a new one from `image`.
    fn recreate(&mut self, image: &str) -> Result<(), DockerError> {
        self.remove_container();
        let (id, init_pid, keep_pid) = self.spec.run_container(&self.client, image)?;
        self.id = id;
        self.init_pid = init_pid;
        self.keep_pid = keep_pid;
        self.dead = false;
        let root = format!("/proc/{init_pid}/root");
        self.root = Some(
            nix::fcntl::open(
                root.as_str(),
                nix::fcntl::OFlag::O_PATH
                    | nix::fcntl::OFlag::O_DIRECTORY
                    | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map(|fd| {
                // SAFETY: open returned a fresh descriptor that nothing else owns.
                unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) }
            })
            .map_err(|e| DockerError::Container {
                id: self.id.clone(),
                reason: format!("opening its root {root}: {e}"),
            })?,
        );
        Ok(())
    }

    fn remove_container(&mut self) {
        self.root = None;
        self.upper_dir = None;
        if self.id.is_empty() {
            return;
        }
        let id = std::mem::take(&mut self.id);
        let r = self.client.block_on(self.client.docker().remove_container(
            &id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                link: false,
            }),
        ));
        if let Err(e) = r {
            tracing::warn!(container = %id, error = %e, "removing a container failed");
        }
        self.dead = true;
    }

    fn remove_snapshots(&mut self) {
        for img in std::mem::take(&mut self.snapshots) {
            let r = self.client.block_on(self.client.docker().remove_image(
                &img,
                Some(RemoveImageOptions {
                    force: true,
                    noprune: false,
                    ..Default::default()
                }),
                None,
            ));
            if let Err(e) = r {
                tracing::warn!(image = %img, error = %e, "removing a snapshot image failed");
            }
        }
    }

    fn alive_or_dead(&mut self) -> Result<(), SandboxError> {
        if self.dead || !std::path::Path::new(&format!("/proc/{}", self.init_pid)).exists() {
            self.dead = true;
            return Err(SandboxError::Dead);
        }
        Ok(())
    }

    fn file_request(
        &mut self,
        f: impl FnOnce(&OwnedFd) -> Response,
    ) -> Result<Response, SandboxError> {
        self.alive_or_dead()?;
        let root = self.root.as_ref().ok_or(SandboxError::Dead)?;
        match f(root) {
            Response::Failed { kind, message } => Err(SandboxError::Request { kind, message }),
            r => Ok(r),
        }
    }

    /// The container's writable layer, from the daemon the first time it is asked.
    fn upper_dir(&mut self) -> Result<Option<std::path::PathBuf>, DockerError> {
        if let Some(u) = &self.upper_dir {
            return Ok(u.clone());
        }
        let info = self.container_info(false)?;
        let upper = info
            .graph_driver
            .as_ref()
            .and_then(|g| g.data.get("UpperDir").map(std::path::PathBuf::from));
        self.upper_dir = Some(upper.clone());
        Ok(upper)
    }

    fn container_info(
        &self,
        size: bool,
    ) -> Result<bollard::models::ContainerInspectResponse, DockerError> {
        self.client
            .block_on(
                self.client
                    .docker()
                    .inspect_container(&self.id, Some(InspectContainerOptions { size })),
            )
            .map_err(|e| DockerError::api(format!("inspect of {}", self.id), e))
    }
}

fn unexpected(request: &'static str, r: Response) -> SandboxError {
    SandboxError::Unexpected {
        request,
        response: format!("{r:?}"),
    }
}

impl SandboxOps for DockerSandbox {
    fn exec(&mut self, req: &ExecRequest) -> Result<ExecResult, SandboxError> {
        self.alive_or_dead()?;
        let r = exec::run(
            &self.client,
            &self.id,
            (self.init_pid, self.keep_pid),
            req,
            &self.spec.env,
        );
        if r.is_err() {
            // A container that went away (its init killed) fails every exec: say so.
            let _ = self.alive_or_dead();
        }
        Ok(r?)
    }

    fn read_file(&mut self, path: &str, max_bytes: u64) -> Result<(Vec<u8>, bool), SandboxError> {
        match self.file_request(|root| files::read_in_root(root, path, max_bytes, false))? {
            Response::File { data, truncated } => Ok((data, truncated)),
            other => Err(unexpected("read_file", other)),
        }
    }

    fn read_file_nofollow(
        &mut self,
        path: &str,
        max_bytes: u64,
    ) -> Result<(Vec<u8>, bool), SandboxError> {
        match self.file_request(|root| files::read_in_root(root, path, max_bytes, true))? {
            Response::File { data, truncated } => Ok((data, truncated)),
            other => Err(unexpected("read_file", other)),
        }
    }

    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> Result<(), SandboxError> {
        match self.file_request(|root| files::write_in_root(root, path, data, mode, None))? {
            Response::Ok => Ok(()),
            other => Err(unexpected("write_file", other)),
        }
    }

    fn stat(&mut self, path: &str) -> Result<FileStat, SandboxError> {
        match self.file_request(|root| files::stat_in_root(root, path))? {
            Response::Stat(s) => Ok(s),
            other => Err(unexpected("stat", other)),
        }
    }

    fn list_dir(&mut self, path: &str) -> Result<Vec<DirEntry>, SandboxError> {
        match self.file_request(|root| files::list_in_root(root, path))? {
            Response::Dir(d) => Ok(d),
            other => Err(unexpected("list_dir", other)),
        }
    }

    fn kill_all(&mut self) -> Result<(), SandboxError> {
        self.alive_or_dead()?;
        host::kill_all_but_init(self.init_pid, self.keep_pid, 1000).map_err(|left| {
            DockerError::Container {
                id: self.id.clone(),
                reason: format!("{left} processes survived kill_all"),
            }
        })?;
        Ok(())
    }

    fn reset(&mut self) -> Result<(), SandboxError> {
        // The container goes first: after a rollback it runs from a snapshot image, which
        // cannot be removed while it does.
        let image = self.spec.image.clone();
        let r = self.recreate(&image);
        self.remove_snapshots();
        Ok(r?)
    }

    fn snapshot(&mut self) -> Result<u32, SandboxError> {
        self.alive_or_dead()?;
        let n = self.snapshots.len() as u32;
        let r = self
            .client
            .block_on(self.client.docker().commit_container(
                CommitContainerOptions {
                    container: Some(self.id.clone()),
                    pause: true,
                    ..Default::default()
                },
                bollard::models::ContainerConfig::default(),
            ))
            .map_err(|e| DockerError::api(format!("commit of {}", self.id), e))?;
        let image = r.id;
        self.snapshots.push(image);
        Ok(n)
    }

    fn rollback(&mut self, snapshot: u32) -> Result<(), SandboxError> {
        let Some(image) = self.snapshots.get(snapshot as usize).cloned() else {
            return Err(SandboxError::Request {
                kind: crate::protocol::FailureKind::NotFound,
                message: format!(
                    "snapshot {snapshot} (this container has {})",
                    self.snapshots.len()
                ),
            });
        };
        Ok(self.recreate(&image)?)
    }

    /// The listing from this host, as the other file requests; the usage by a walk of the
    /// container's writable layer (no daemon request after the container's first).
    fn overview(&mut self, path: &str, max_entries: u32) -> Result<Overview, SandboxError> {
        self.alive_or_dead()?;
        let upper_bytes = self.upper_dir()?.map_or(0, |u| host::usage(&u).0);
        match self
            .file_request(|root| files::overview_in_root(root, path, max_entries, upper_bytes))?
        {
            Response::Overview(o) => Ok(o),
            other => Err(unexpected("overview", other)),
        }
    }

    fn health(&mut self) -> Result<Health, SandboxError> {
        self.alive_or_dead()?;
        let (upper_bytes, upper_inodes) = self.upper_dir()?.map_or((0, 0), |u| host::usage(&u));
        let (shm_bytes, shm_inodes) =
            host::fs_used(&format!("/proc/{}/root/dev/shm", self.init_pid));
        let processes = host::others(self.init_pid, self.keep_pid).len() as u32;
        Ok(Health {
            pid_in_sandbox: 1,
            processes,
            snapshots: self.snapshots.len() as u32,
            upper_bytes,
            upper_inodes,
            shm_bytes,
            shm_inodes,
            zygote_pid: None,
        })
    }

    fn is_alive(&self) -> bool {
        !self.dead && std::path::Path::new(&format!("/proc/{}", self.init_pid)).exists()
    }

    fn init_pid(&self) -> i32 {
        self.init_pid
    }

    fn pids_usage(&self) -> (u64, Option<u64>) {
        (
            host::members(self.init_pid).len() as u64,
            Some(self.spec.pids),
        )
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        self.remove_container();
        self.remove_snapshots();
    }
}
