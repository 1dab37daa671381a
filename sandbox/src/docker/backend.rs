//! [`DockerBackend`]: sandboxes as Docker containers, with the sandbox configuration mapped
//! to Docker's: the root filesystem must be `docker:IMAGE`; memory (swap off), pids and CPUs
//! become the container's cgroup limits; the network is `none` (only `lo`); capabilities are
//! dropped to the kept set; `no-new-privileges`; `readonly_paths` are Docker's read-only
//! paths; the environment, hostname and `RLIMIT_NOFILE` carry over; Docker's init reaps. Seccomp is the daemon's
//! default profile and there is no landlock. The writable layer's size is not limited (the
//! overlay2 driver limits it only on xfs with project quotas): a documented gap.
//!
//! Containers carry the label `envfactory.owner=<pid> <start time>` of the process that made
//! them; creating a backend removes those whose owner is gone (a crashed run leaks nothing).

use super::container::DockerSandbox;
use super::{image, Client, DockerError};
use crate::backend::Backend;
use crate::layers::RootfsSpec;
use crate::{SandboxConfig, SandboxError};
use bollard::models::{ContainerCreateBody, HostConfig, ResourcesUlimits};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The label naming the process that created a container.
pub const OWNER_LABEL: &str = "envfactory.owner";

/// What keeps a container alive: Docker's init (tini, from the host, PID 1: it reaps orphans)
/// runs the image's `/bin/sh` reading a stdin that stays open and never gets a byte. It is
/// started before any command, never restarted (an agent's replacement of `/bin/sh` never
/// runs as it), spared by `kill_all` and not counted as a process. Killing it ends the
/// container (the sandbox is then dead, as a native one whose init is killed).
const KEEP_ALIVE: [&str; 1] = ["/bin/sh"];

/// Capability names by number, for Docker's `CapAdd`.
const CAP_NAMES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// What every container of one configuration is made of.
#[derive(Debug)]
pub(crate) struct Spec {
    /// The image id containers start from.
    pub image: String,
    pub env: Vec<String>,
    /// The pids limit.
    pub pids: u64,
    host_config: HostConfig,
    hostname: String,
    owner: String,
}

impl Spec {
    /// Create and start a container of `image`; returns its id, its init's host pid and the
    /// keep-alive's.
    pub(crate) fn run_container(
        &self,
        client: &Client,
        image: &str,
    ) -> Result<(String, i32, i32), DockerError> {
        let docker = client.docker();
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            cmd: Some(KEEP_ALIVE.iter().map(|s| s.to_string()).collect()),
            entrypoint: Some(Vec::new()),
            env: Some(self.env.clone()),
            hostname: Some(self.hostname.clone()),
            working_dir: Some("/".into()),
            user: Some("0:0".into()),
            labels: Some(HashMap::from([(
                OWNER_LABEL.to_string(),
                self.owner.clone(),
            )])),
            network_disabled: Some(true),
            open_stdin: Some(true),
            attach_stdin: Some(false),
            stdin_once: Some(false),
            host_config: Some(self.host_config.clone()),
            ..Default::default()
        };
        client.block_on(async {
            let created = docker
                .create_container(None::<CreateContainerOptions>, body)
                .await
                .map_err(|e| DockerError::api(format!("create from {image}"), e))?;
            let id = created.id;
            let remove = || async {
                let _ = docker
                    .remove_container(
                        &id,
                        Some(RemoveContainerOptions {
                            force: true,
                            v: true,
                            link: false,
                        }),
                    )
                    .await;
            };
            if let Err(e) = docker
                .start_container(&id, None::<StartContainerOptions>)
                .await
            {
                remove().await;
                return Err(DockerError::api(format!("start of {id}"), e));
            }
            let (pid, why) = match docker
                .inspect_container(&id, None::<InspectContainerOptions>)
                .await
            {
                Ok(info) => {
                    let s = info.state.unwrap_or_default();
                    let why = format!(
                        "status {}, exit code {}{}",
                        s.status.map_or("unknown".to_string(), |st| st.to_string()),
                        s.exit_code.unwrap_or(0),
                        s.error
                            .filter(|e| !e.is_empty())
                            .map_or(String::new(), |e| format!(", {e}"))
                    );
                    (s.pid.unwrap_or(0), why)
                }
                Err(e) => {
                    remove().await;
                    return Err(DockerError::api(format!("inspect of {id}"), e));
                }
            };
            if pid <= 0 {
                remove().await;
                return Err(DockerError::Container {
                    id,
                    reason: format!(
                        "started, but has no init process ({why}): the image needs /bin/sh"
                    ),
                });
            }
            let pid = pid as i32;
            let Some(keep) = super::host::first_child(pid) else {
                remove().await;
                return Err(DockerError::Container {
                    id,
                    reason: "its init started no keep-alive process (the image needs /bin/sh)"
                        .into(),
                });
            };
            Ok((id, pid, keep))
        })
    }
}

/// A source of Docker-backed sandboxes on one daemon.
#[derive(Debug, Clone)]
pub struct DockerBackend {
    client: Client,
    /// Where images with layers stacked on them are assembled (then removed).
    work: std::path::PathBuf,
    /// Containers of gone runs removed when this backend was created.
    reaped: usize,
}

impl DockerBackend {
    /// A backend on `client`'s daemon, assembling layered images under `work`; removes
    /// containers whose creating process is gone.
    pub fn new(client: Client, work: &std::path::Path) -> Self {
        let mut b = Self {
            client,
            work: work.to_path_buf(),
            reaped: 0,
        };
        b.reaped = b.reap();
        b
    }

    /// How many containers of gone runs were removed when this backend was created.
    pub fn reaped_at_start(&self) -> usize {
        self.reaped
    }

    /// The daemon's client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Remove every container labelled with an owner that no longer runs; returns how many.
    pub fn reap(&self) -> usize {
        self.remove_where(|owner| crate::state::is_alive(owner).is_none())
    }

    /// Remove every container this process created (a signal's teardown); returns how many.
    pub fn remove_own(&self) -> usize {
        let me = crate::state::identity(std::process::id() as i32);
        self.remove_where(|owner| owner == me)
    }

    fn remove_where(&self, doomed: impl Fn(&str) -> bool) -> usize {
        let docker = self.client.docker();
        let list = self
            .client
            .block_on(docker.list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![OWNER_LABEL.to_string()],
                )])),
                ..Default::default()
            })));
        let Ok(list) = list else { return 0 };
        let mut removed = 0;
        for c in list {
            let owner = c.labels.as_ref().and_then(|l| l.get(OWNER_LABEL));
            let (Some(id), Some(owner)) = (c.id, owner) else {
                continue;
            };
            if !doomed(owner) {
                continue;
            }
            let r = self.client.block_on(docker.remove_container(
                &id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    link: false,
                }),
            ));
            if r.is_ok() {
                removed += 1;
                tracing::info!(container = %id, owner = %owner, "removed a container");
            }
        }
        removed
    }

    /// The container specification of `cfg`.
    fn spec(&self, cfg: &SandboxConfig) -> Result<Spec, DockerError> {
        cfg.validate().map_err(DockerError::Config)?;
        let RootfsSpec::Docker(image) = &cfg.rootfs else {
            return Err(DockerError::Config(format!(
                "runs `docker:IMAGE` root filesystems only, not `{}`",
                cfg.rootfs
            )));
        };
        let mut image = image::image_id(&self.client, image)?;
        if !cfg.layers.is_empty() {
            image = super::layered::ensure(&self.client, &image, &cfg.layers, &self.work)?;
        }
        let mut cap_add = Vec::new();
        for c in &cfg.keep_caps {
            let name = CAP_NAMES
                .get(usize::from(*c))
                .ok_or_else(|| DockerError::Config(format!("knows no capability number {c}")))?;
            cap_add.push(name.to_string());
        }
        let nofile = i64::try_from(cfg.nofile)
            .map_err(|_| DockerError::Config(format!("nofile {} is too large", cfg.nofile)))?;
        let memory = i64::try_from(cfg.limits.memory_bytes).map_err(|_| {
            DockerError::Config(format!("memory {} is too large", cfg.limits.memory_bytes))
        })?;
        let host_config = HostConfig {
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(i64::try_from(cfg.limits.pids).unwrap_or(i64::MAX)),
            nano_cpus: (cfg.limits.cpus > 0.0).then_some((cfg.limits.cpus * 1e9) as i64),
            network_mode: Some("none".into()),
            init: Some(true),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(cap_add),
            security_opt: Some(vec!["no-new-privileges".into()]),
            // A list of ours replaces Docker's whole default list, so the defaults go first:
            // without them a writable /proc/sys lets the container's root set host sysctls
            // (kernel.core_pattern runs a program as root on the host).
            readonly_paths: (!cfg.readonly_paths.is_empty()).then(|| {
                DOCKER_READONLY_PATHS
                    .iter()
                    .map(|p| p.to_string())
                    .chain(cfg.readonly_paths.iter().cloned())
                    .collect()
            }),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(nofile),
                hard: Some(nofile),
            }]),
            ..Default::default()
        };
        Ok(Spec {
            image,
            env: cfg.env.clone(),
            pids: cfg.limits.pids,
            host_config,
            hostname: cfg.hostname.clone(),
            owner: crate::state::identity(std::process::id() as i32),
        })
    }
}

/// Docker's own default read-only paths (moby's `oci.DefaultSpec`), kept whenever the
/// sandbox adds read-only paths of its own.
const DOCKER_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

impl Backend for DockerBackend {
    type Sandbox = DockerSandbox;

    fn name(&self) -> &'static str {
        "docker"
    }

    /// A reset or rollback makes a new container: a new network namespace and init.
    fn keeps_namespaces_across_resets(&self) -> bool {
        false
    }

    fn create(&self, cfg: &SandboxConfig) -> Result<DockerSandbox, SandboxError> {
        let spec = Arc::new(self.spec(cfg)?);
        Ok(DockerSandbox::start(self.client.clone(), spec)?)
    }
}
