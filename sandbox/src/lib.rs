//! `sandbox`: isolated, snapshot-able Linux environments. Knows no RL.

pub mod oci;
