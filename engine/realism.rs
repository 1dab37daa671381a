//! Realism: the real set of systems (`fingerprint::shipped()`) against generated instances,
//! the features a realism classifier sees (scaled), and the held-out AUC of a freshly trained
//! [`policies::discriminator::Discriminator`] (`engine fingerprint auc`, docs/fingerprints.md).
//!
//! Generated instances are measured as the agent finds them, minus what would give the class
//! away without saying anything about realism: the plan's task is dropped (its files and its
//! processes exist only in generated instances), and the features of the sandbox's writable
//! layer are not used (empty in a measured root filesystem, the instance's own changes in a
//! generated one; see [`EXCLUDED`]).

use crate::fingerprint::{self, Fingerprint, FingerprintError, FEATURES};
use crate::running::{self, RunningError, RunningInstance};
use crate::template::Template;
use policies::discriminator::{auc, Discriminator, DiscriminatorConfig, DiscriminatorError};
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

#[derive(Debug, thiserror::Error)]
pub enum RealismError {
    #[error(transparent)]
    Fingerprint(#[from] FingerprintError),
    #[error(transparent)]
    Running(#[from] RunningError),
    #[error(transparent)]
    Discriminator(#[from] DiscriminatorError),
    #[error("realism: {0}")]
    Data(String),
}

/// Fingerprint features the classifier does not see, with why.
pub const EXCLUDED: &[(&str, &str)] = &[
    (
        "disk_total_bytes",
        "the sandbox's writable layer size (its configuration, not the system)",
    ),
    ("inodes_total", "the writable layer's inodes (configuration)"),
    (
        "disk_used_bytes",
        "the writable layer's content: empty for a measured rootfs, the instance's own changes for a generated one",
    ),
    ("disk_used_frac", "as disk_used_bytes"),
    ("inodes_used", "as disk_used_bytes"),
    ("inodes_used_frac", "as disk_used_bytes"),
    ("tools_checked", "a constant (the TOOLS list)"),
];

/// Features that are counts or sizes: scaled by `sign(x) ln(1 + |x|)` before the z-score.
const LOG_SCALED: &[&str] = &[
    "path_entries",
    "path_missing_dirs",
    "path_relative_entries",
    "path_duplicates",
    "tools_available",
    "tools_nonstandard_location",
    "tools_scripts",
    "dpkg_packages",
    "dpkg_essential",
    "dpkg_verify_failures",
    "dpkg_verify_missing",
    "listening_tcp",
    "processes",
    "zombies",
    "clock_offset_s",
    "locales_available",
    "nofile",
    "resolv_nameservers",
    "resolv_bad_lines",
    "env_vars",
    "env_nonstandard",
];

/// Names of the features the classifier sees, in vector order.
pub fn feature_names() -> Vec<&'static str> {
    FEATURES
        .iter()
        .map(|f| f.0)
        .filter(|n| !EXCLUDED.iter().any(|e| e.0 == *n))
        .collect()
}

/// The classifier's raw input of a fingerprint: the used features, counts and sizes log
/// scaled, unmeasured ones as `-1` before scaling (as in `Fingerprint::vector`).
pub fn realism_vector(fp: &Fingerprint) -> Vec<f32> {
    feature_names()
        .into_iter()
        .map(|n| {
            let v = fp.get(n).unwrap_or(-1.0);
            let v = if LOG_SCALED.contains(&n) {
                v.signum() * v.abs().ln_1p()
            } else {
                v
            };
            v as f32
        })
        .collect()
}

/// Per-feature z-score with the statistics of a training split (a constant feature keeps
/// scale 1, so it maps to 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scaler {
    pub mean: Vec<f32>,
    pub std: Vec<f32>,
}

impl Scaler {
    /// Statistics of `rows` (each of the same width; at least one).
    pub fn fit(rows: &[&[f32]]) -> Self {
        let d = rows.first().map_or(0, |r| r.len());
        let n = rows.len().max(1) as f64;
        let mut mean = vec![0f64; d];
        for r in rows {
            for (m, v) in mean.iter_mut().zip(r.iter()) {
                *m += f64::from(*v) / n;
            }
        }
        let mut var = vec![0f64; d];
        for r in rows {
            for ((s, v), m) in var.iter_mut().zip(r.iter()).zip(&mean) {
                *s += (f64::from(*v) - m).powi(2) / n;
            }
        }
        Self {
            mean: mean.iter().map(|m| *m as f32).collect(),
            std: var
                .iter()
                .map(|v| {
                    if v.sqrt() > 1e-6 {
                        v.sqrt() as f32
                    } else {
                        1.0
                    }
                })
                .collect(),
        }
    }

    /// `(x - mean) / std`, row-major rows appended to `out`.
    pub fn apply(&self, row: &[f32], out: &mut Vec<f32>) {
        out.extend(
            row.iter()
                .zip(self.mean.iter().zip(&self.std))
                .map(|(v, (m, s))| (v - m) / s),
        );
    }
}

/// A generated instance's measurement: which template and seed, its faults, the fingerprint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generated {
    pub template: String,
    /// The plan's base root filesystem.
    pub base: String,
    pub seed: u64,
    pub faults: Vec<String>,
    pub fingerprint: Fingerprint,
}

/// Measure the instances of `template`'s sampled plans for seeds `seed..seed+count`, each
/// without its task (see the module comment), started as an episode starts and measured as
/// the agent's commands see it. With `bases`, seed `s`'s plan is put on `bases[s % len]`
/// instead of the template's base (a real root filesystem: then only the faults differ from
/// a real system). Plans a base cannot take are skipped.
pub fn measure_generated(
    rt: &sandbox::Runtime,
    cache: &crate::synth::Cache,
    template: &Template,
    seed: u64,
    count: u64,
    bases: &[String],
) -> Result<Vec<Generated>, RealismError> {
    let mut out = Vec::new();
    for s in seed..seed.saturating_add(count) {
        let mut plan = template.sample(s);
        plan.task = None;
        if !bases.is_empty() {
            plan.base = bases[(s % bases.len() as u64) as usize].clone();
        }
        let base = plan.base.clone();
        let faults = plan.perturbations.iter().map(|p| p.name.clone()).collect();
        let Some(fp) = measure_plan(rt, cache, &plan)? else {
            tracing::info!(template = %template.name, seed = s, "plan not applicable, skipped");
            continue;
        };
        tracing::debug!(template = %template.name, seed = s, "generated instance measured");
        out.push(Generated {
            template: template.name.clone(),
            base,
            seed: s,
            faults,
            fingerprint: fp,
        });
    }
    Ok(out)
}

/// The fingerprint of a plan's instance, started as an episode starts and measured as the
/// agent's commands see it (the caller drops the task when it must not be seen); `None`
/// when the plan does not apply to its base.
pub fn measure_plan(
    rt: &sandbox::Runtime,
    cache: &crate::synth::Cache,
    plan: &crate::instance::Plan,
) -> Result<Option<Fingerprint>, RealismError> {
    let held = match running::synthesize(rt, cache, plan) {
        Ok(h) => h,
        Err(e) if e.not_applicable().is_some() => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let mut inst = RunningInstance::start(rt, held)?;
    Ok(Some(fingerprint::fingerprint_running(&mut inst)?))
}

/// The shipped real fingerprints (name, fingerprint).
pub fn real_set() -> Result<Vec<(String, Fingerprint)>, RealismError> {
    fingerprint::shipped()
        .into_iter()
        .map(|(n, _)| Ok((n.to_string(), fingerprint::shipped_fingerprint(n)?)))
        .collect()
}

/// How the AUC is estimated.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AucOptions {
    /// Random stratified splits (each its own classifier).
    pub splits: usize,
    /// Fraction of each class held out.
    pub test_frac: f64,
    pub seed: u64,
    pub epochs: usize,
    pub batch: usize,
    pub hidden: Vec<usize>,
}

impl Default for AucOptions {
    fn default() -> Self {
        Self {
            splits: 20,
            test_frac: 0.3,
            seed: 1,
            epochs: 200,
            batch: 16,
            hidden: vec![32, 32],
        }
    }
}

/// The AUC report.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AucReport {
    pub real: usize,
    pub generated: usize,
    pub features: Vec<String>,
    pub options: AucOptions,
    /// Held-out AUC of each split.
    pub split_auc: Vec<f64>,
    pub mean: f64,
    pub median: f64,
    /// 2.5 % and 97.5 % quantiles of the split AUCs.
    pub ci95: (f64, f64),
    /// Each feature alone (after scaling) as a score, over all rows: its AUC folded to
    /// `max(a, 1 - a)` (1 = it separates the classes by itself), highest first.
    pub feature_auc: Vec<(String, f64)>,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

/// Train a fresh classifier per split on real vs generated rows (raw [`realism_vector`]s,
/// scaled with the training split's statistics) and measure its AUC on the held-out rows.
pub fn evaluate(
    real: &[Vec<f32>],
    generated: &[Vec<f32>],
    opts: &AucOptions,
) -> Result<AucReport, RealismError> {
    let d = feature_names().len();
    let test_n = |n: usize| ((n as f64 * opts.test_frac).round() as usize).clamp(1, n - 1);
    if real.len() < 2 || generated.len() < 2 {
        return Err(RealismError::Data(format!(
            "need at least 2 real and 2 generated fingerprints, have {} and {}",
            real.len(),
            generated.len()
        )));
    }
    if let Some(r) = real.iter().chain(generated).find(|r| r.len() != d) {
        return Err(RealismError::Data(format!(
            "a row has {} features, not {d}",
            r.len()
        )));
    }
    if opts.splits == 0 || !(opts.test_frac > 0.0 && opts.test_frac < 1.0) {
        return Err(RealismError::Data(
            "splits must be >= 1 and test_frac in (0, 1)".into(),
        ));
    }
    let cfg = DiscriminatorConfig {
        input_dim: d,
        hidden: opts.hidden.clone(),
        ..DiscriminatorConfig::default()
    };
    let mut split_auc = Vec::new();
    for k in 0..opts.splits {
        let split_seed = opts.seed.wrapping_add(k as u64);
        let mut rng = crate::instance::rng_for(split_seed, "realism/split");
        let mut ri: Vec<usize> = (0..real.len()).collect();
        let mut gi: Vec<usize> = (0..generated.len()).collect();
        ri.shuffle(&mut rng);
        gi.shuffle(&mut rng);
        let (r_test, r_train) = ri.split_at(test_n(real.len()));
        let (g_test, g_train) = gi.split_at(test_n(generated.len()));
        let train_rows: Vec<&[f32]> = r_train
            .iter()
            .map(|&i| real[i].as_slice())
            .chain(g_train.iter().map(|&i| generated[i].as_slice()))
            .collect();
        let scaler = Scaler::fit(&train_rows);
        let rows = |idx: &[usize], src: &[Vec<f32>]| {
            let mut out = Vec::with_capacity(idx.len() * d);
            for &i in idx {
                scaler.apply(&src[i], &mut out);
            }
            out
        };
        let mut disc = Discriminator::new(&cfg, split_seed)?;
        disc.fit(
            &rows(r_train, real),
            &rows(g_train, generated),
            opts.epochs,
            opts.batch,
        )?;
        let pos = disc.logits(&rows(r_test, real))?;
        let neg = disc.logits(&rows(g_test, generated))?;
        let a = auc(&pos, &neg).unwrap_or(f64::NAN);
        tracing::info!(split = k, auc = a, "realism split");
        split_auc.push(a);
    }
    let mut sorted = split_auc.clone();
    sorted.sort_by(f64::total_cmp);
    let all: Vec<&[f32]> = real.iter().chain(generated).map(|r| r.as_slice()).collect();
    let scaler = Scaler::fit(&all);
    let names = feature_names();
    let mut feature_auc: Vec<(String, f64)> = (0..d)
        .map(|j| {
            let col = |src: &[Vec<f32>]| -> Vec<f32> {
                src.iter()
                    .map(|r| (r[j] - scaler.mean[j]) / scaler.std[j])
                    .collect()
            };
            let a = auc(&col(real), &col(generated)).unwrap_or(0.5);
            (names[j].to_string(), a.max(1.0 - a))
        })
        .collect();
    feature_auc.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(AucReport {
        real: real.len(),
        generated: generated.len(),
        features: names.iter().map(|s| s.to_string()).collect(),
        options: opts.clone(),
        mean: split_auc.iter().sum::<f64>() / split_auc.len() as f64,
        median: quantile(&sorted, 0.5),
        ci95: (quantile(&sorted, 0.025), quantile(&sorted, 0.975)),
        split_auc,
        feature_auc,
    })
}

impl AucReport {
    /// The human form.
    pub fn text(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "real {}  generated {}  features {}  splits {} (test {:.0}% of each class)",
            self.real,
            self.generated,
            self.features.len(),
            self.split_auc.len(),
            self.options.test_frac * 100.0
        );
        let _ = writeln!(
            s,
            "held-out AUC: mean {:.3}  median {:.3}  95% interval over splits [{:.3}, {:.3}]",
            self.mean, self.median, self.ci95.0, self.ci95.1
        );
        let _ = writeln!(s, "features that separate the classes alone (folded AUC):");
        for (n, a) in self.feature_auc.iter().take(10) {
            let _ = writeln!(s, "  {n:<28} {a:.3}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn scaler_zscores_and_keeps_constants_finite() {
        let rows: Vec<Vec<f32>> = vec![vec![1.0, 5.0], vec![3.0, 5.0]];
        let refs: Vec<&[f32]> = rows.iter().map(|r| r.as_slice()).collect();
        let s = Scaler::fit(&refs);
        let mut out = Vec::new();
        s.apply(&rows[0], &mut out);
        s.apply(&rows[1], &mut out);
        assert_eq!(out, vec![-1.0, 0.0, 1.0, 0.0]);
        assert_eq!(quantile(&[0.0, 1.0], 0.5), 0.5);
    }

    #[test]
    fn excluded_features_exist_and_are_not_used() {
        let used = feature_names();
        for (n, _) in EXCLUDED {
            assert!(FEATURES.iter().any(|f| f.0 == *n), "{n}");
            assert!(!used.contains(n));
        }
        for n in LOG_SCALED {
            assert!(used.contains(n), "{n}");
        }
    }
}
