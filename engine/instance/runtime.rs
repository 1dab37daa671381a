//! What a layer cannot hold: the command environment, limits, read-only paths, steps run at
//! every episode start, and the fault proxies (their specification; the running proxy is
//! `netfault.rs`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A process or preparation that must run at every episode start (a reset kills every process
/// and reverts the writable layer). Run in order as `sh -c`; daemons must detach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartStep {
    /// Who asked for it (a perturbation or task name), for error messages.
    pub by: String,
    pub shell: String,
}

/// A fault-injecting TCP proxy run by the engine inside the sandbox's network namespace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProxySpec {
    pub listen_port: u16,
    pub upstream_port: u16,
    pub toxics: Toxics,
}

/// What a layer cannot hold.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSettings {
    /// Variables set (`Some`) or removed (`None`) in the environment of every command.
    pub env: BTreeMap<String, Option<String>>,
    pub nofile: Option<u64>,
    /// Overrides the template's disk size.
    pub disk_bytes: Option<u64>,
    /// Inodes of the writable layer (`None`: the tmpfs default).
    #[serde(default)]
    pub disk_inodes: Option<u64>,
    /// Paths bound read-only over themselves in the sandbox (writes fail with EROFS).
    #[serde(default)]
    pub readonly: Vec<String>,
    pub start: Vec<StartStep>,
    pub proxies: Vec<ProxySpec>,
    /// Record the processes alive after the start steps at each episode start
    /// (`Probe::start_processes`), for verifiers that must tell them from later ones.
    #[serde(default)]
    pub record_start_processes: bool,
}

impl RuntimeSettings {
    /// The command environment: the sandbox default with this instance's changes applied.
    pub fn apply_env(&self, base: &[String]) -> Vec<String> {
        let mut out: Vec<String> = base
            .iter()
            .filter(|kv| {
                let k = kv.split('=').next().unwrap_or("");
                !self.env.contains_key(k)
            })
            .cloned()
            .collect();
        for (k, v) in &self.env {
            if let Some(v) = v {
                out.push(format!("{k}={v}"));
            }
        }
        out
    }
}

/// What the proxy does to a connection (Toxiproxy's toxics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Toxics {
    /// Added to every chunk in each direction.
    pub latency_ms: u64,
    /// Uniform extra delay in 0..=jitter_ms per chunk.
    pub jitter_ms: u64,
    /// Bytes per second in each direction (0 = unlimited).
    pub bandwidth_bps: u64,
    /// Probability that a new connection is dropped at once.
    pub drop_probability: f64,
    /// Probability that a new connection is accepted and then never answered.
    pub stall_probability: f64,
    /// Probability that a connection is reset after some bytes.
    pub reset_probability: f64,
    /// Close the connection after this many ms (0 = never): a timeout toxic.
    pub timeout_ms: u64,
    /// Seed of the proxy's choices.
    pub seed: u64,
    /// A connection chosen for a reset gets it once this many bytes went to the client
    /// (0: as soon as the client sends anything).
    #[serde(default)]
    pub reset_after_bytes: u64,
}

/// The front port clients use by default (the `port` parameter's default).
pub const FRONT_PORT: u16 = 8080;
/// The port a task's service listens on by default (the `upstream` parameter's default).
pub const SERVICE_PORT: u16 = 18080;

/// A proxy that only forwards (no toxics): a task's front port.
pub fn plain_forward(port: u16, upstream: u16) -> ProxySpec {
    ProxySpec {
        listen_port: port,
        upstream_port: upstream,
        toxics: Toxics::default(),
    }
}
