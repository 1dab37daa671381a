//! Network faults. This kernel has no netem, so faults come from a TCP proxy that the engine
//! runs inside the sandbox's network namespace (Toxiproxy's design): clients connect to the
//! proxy's port, the proxy forwards to the real service and applies the toxics.

use super::Perturbation;
use serde::{Deserialize, Serialize};

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
}

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![]
}

/// A running proxy; dropping it stops it.
pub struct ProxyHandle {
    _private: (),
}

/// Start a proxy inside the network namespace of the sandbox whose init is `init_pid`.
pub fn start_proxy(
    _init_pid: i32,
    spec: &crate::synth::ProxySpec,
) -> Result<ProxyHandle, super::PerturbError> {
    Err(super::PerturbError::NotApplicable(format!(
        "proxy {} -> {}: the fault proxy is not built yet",
        spec.listen_port, spec.upstream_port
    )))
}
