//! Content addresses and seeded randomness: an instance id is the sha256 of the catalogue
//! version, the base's digest and the plan.

use super::plan::Plan;
use rand::SeedableRng;
use sha2::Digest;

/// Bumped whenever a perturbation or task changes what it builds, or a task's oracle or
/// verifier changes: old instance ids die with it, and so do their certificates.
pub const CATALOGUE_VERSION: u32 = 12;

/// The content address of a plan on a base.
pub fn instance_id(plan: &Plan, base_digest: &str) -> String {
    let mut h = sha2::Sha256::new();
    h.update(format!("envfactory-instance v{CATALOGUE_VERSION}\n").as_bytes());
    h.update(base_digest.as_bytes());
    h.update(b"\n");
    // serde_json of these plain structs is deterministic (fields in declaration order,
    // BTreeMaps sorted).
    h.update(serde_json::to_vec(plan).unwrap_or_default());
    format!("i-{}", &hex::encode(h.finalize())[..24])
}

/// A seeded generator for one purpose of one instance, independent of the others.
pub fn rng_for(seed: u64, purpose: &str) -> rand_chacha::ChaCha8Rng {
    let mut h = sha2::Sha256::new();
    h.update(seed.to_le_bytes());
    h.update(purpose.as_bytes());
    let d = h.finalize();
    let mut s = [0u8; 32];
    s.copy_from_slice(&d);
    rand_chacha::ChaCha8Rng::from_seed(s)
}
