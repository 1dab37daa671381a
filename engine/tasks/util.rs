//! Helpers shared by the task families: seeded choices, generated text, hashing, quoting and
//! the verdict for unreadable facts.

use super::{TaskError, Verdict};
use crate::instance::TaskSetup;
use crate::probe::{Probe, ProbeError};
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::Digest;

/// Application names the generators draw from.
pub const APPS: &[&str] = &[
    "orbit", "quill", "harbor", "lumen", "sprocket", "tundra", "vireo", "basalt", "cinder",
    "nimbus", "pylon", "juniper",
];

/// The clean environment prefix of oracle commands: the system's own tools, nothing the
/// instance's `PATH` or variables put first.
pub const CLEAN_ENV: &str = "/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C";

pub fn pick<'a, T>(rng: &mut impl Rng, xs: &'a [T]) -> &'a T {
    &xs[rng.gen_range(0..xs.len())]
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

/// A short random lowercase hex token.
pub fn token(rng: &mut impl Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from_digit(rng.gen_range(0..16), 16).unwrap_or('0'))
        .collect()
}

/// `n` plausible log lines of an application.
pub fn log_lines(rng: &mut impl Rng, app: &str, n: usize) -> String {
    const LEVELS: &[&str] = &["INFO", "INFO", "INFO", "WARN", "DEBUG", "ERROR"];
    const WHAT: &[&str] = &[
        "request served",
        "cache miss",
        "connection opened",
        "connection closed",
        "retrying upstream",
        "job finished",
        "slow query",
        "config reloaded",
    ];
    let mut s = String::new();
    for _ in 0..n {
        s.push_str(&format!(
            "2024-01-{:02}T{:02}:{:02}:{:02}Z {} {app}[{}] {} id={}\n",
            rng.gen_range(1..29),
            rng.gen_range(0..24),
            rng.gen_range(0..60),
            rng.gen_range(0..60),
            pick(rng, LEVELS),
            rng.gen_range(100..30000),
            pick(rng, WHAT),
            token(rng, 8),
        ));
    }
    s
}

/// The task's facts as the type it stored, or the failed verdict that says they are unreadable.
pub fn facts<T: DeserializeOwned>(setup: &TaskSetup) -> Result<T, Verdict> {
    // Read from the stored JSON in place: verifiers ask at every step, and a clone of the
    // whole value (maps of every file's path and digest) cost as much as the reading.
    T::deserialize(&setup.facts)
        .map_err(|e| Verdict::failed("facts", format!("the task's facts are unreadable: {e}")))
}

/// Facts as the JSON stored in [`TaskSetup::facts`].
pub fn to_facts<T: Serialize>(facts: &T) -> Result<serde_json::Value, TaskError> {
    serde_json::to_value(facts).map_err(|e| TaskError::Setup(format!("facts: {e}")))
}

/// Owned words (keywords of a setup).
pub fn words(ws: &[&str]) -> Vec<String> {
    ws.iter().map(|w| w.to_string()).collect()
}

/// A check that a regular file (read through the probe, at most `max` bytes) has the sha256
/// `want`, with the reason when it does not.
pub fn content_check(
    probe: &mut dyn Probe,
    path: &str,
    want: &str,
    max: u64,
) -> Result<(bool, String), ProbeError> {
    Ok(match probe.read(path, max)? {
        None => (false, format!("{path} is missing or not a regular file")),
        Some(d) => (
            sha256_hex(&d) == want,
            format!("{path} has the wrong contents"),
        ),
    })
}
