//! The figures of an experiment: per seed ([`SeedResult`], from its episodes), and over seeds
//! (mean and Student-t 95% interval, [`Interval`]), gathered in the [`Report`].

use super::{Agent, EpisodeRecord};
use crate::env::RewardConfig;
use serde::Serialize;
use std::path::PathBuf;

/// Per-seed result.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub episodes: usize,
    pub skipped_uncertified: usize,
    pub skipped_not_applicable: usize,
    pub infra_failures: usize,
    /// Episodes the agent could no longer act in (counted as failures, not masked).
    pub agent_failures: usize,
    pub successes: usize,
    pub steps: u64,
    pub seconds: f64,
    /// Env steps over the seed's wall time (resets and certification included).
    pub steps_per_s: f64,
    /// Over the episodes that ran (not skipped) without infrastructure failure (null when
    /// none did).
    pub success_rate: f64,
    pub mean_return: f64,
    pub reset_ms_median: f64,
}

/// Mean and 95% confidence half-width (Student t) over seeds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Interval {
    pub mean: f64,
    pub ci95: f64,
}

impl Interval {
    pub fn of(v: &[f64]) -> Self {
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        if v.len() < 2 {
            return Self {
                mean,
                ci95: f64::NAN,
            };
        }
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
        // Two-sided 97.5% quantiles of Student's t for 1..=30 degrees of freedom.
        const T: [f64; 30] = [
            12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
            2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
            2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
        ];
        let t = T.get(v.len() - 2).copied().unwrap_or(1.96);
        Self {
            mean,
            ci95: t * (var / n).sqrt(),
        }
    }

    /// Over the finite values only (a seed without a valid episode has no success rate).
    pub fn of_finite(v: &[f64]) -> Self {
        let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        Self::of(&f)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub name: String,
    pub template: Option<PathBuf>,
    pub task: String,
    pub agent: Agent,
    pub workers: usize,
    pub episodes_per_seed: usize,
    pub episodes_per_instance: usize,
    pub require_certified: bool,
    pub reward: RewardConfig,
    pub seeds: Vec<SeedResult>,
    pub steps_per_s: Interval,
    pub success_rate: Interval,
    pub mean_return: Interval,
    pub reset_ms: Interval,
    pub episodes_file: PathBuf,
    /// A signal stopped the run: the figures are of the episodes that finished.
    pub interrupted: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Per-seed figures of its episodes.
pub fn summarize(seed: u64, records: &[EpisodeRecord], seconds: f64) -> SeedResult {
    let valid: Vec<&EpisodeRecord> = records
        .iter()
        .filter(|r| !r.infra && !r.skipped_uncertified && !r.skipped_not_applicable)
        .collect();
    let steps: u64 = records.iter().map(|r| u64::from(r.steps)).sum();
    let successes = valid.iter().filter(|r| r.success).count();
    let n = valid.len() as f64;
    SeedResult {
        seed,
        episodes: records.len(),
        skipped_uncertified: records.iter().filter(|r| r.skipped_uncertified).count(),
        skipped_not_applicable: records.iter().filter(|r| r.skipped_not_applicable).count(),
        infra_failures: records.iter().filter(|r| r.infra).count(),
        agent_failures: records.iter().filter(|r| r.agent_failure).count(),
        successes,
        steps,
        seconds,
        steps_per_s: if seconds > 0.0 {
            steps as f64 / seconds
        } else {
            f64::NAN
        },
        success_rate: successes as f64 / n,
        mean_return: valid.iter().map(|r| r.return_).sum::<f64>() / n,
        reset_ms_median: median(records.iter().filter_map(|r| r.reset_ms).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(success: bool, ret: f64, steps: u32, infra: bool, skipped: bool) -> EpisodeRecord {
        EpisodeRecord {
            seed: 1,
            worker: 0,
            episode: 0,
            plan_seed: 1,
            instance: None,
            perturbations: vec![],
            success,
            return_: ret,
            steps,
            infra,
            skipped_uncertified: skipped,
            skipped_not_applicable: false,
            reset_ms: (!skipped).then_some(2.0),
            error: None,
            agent_failure: false,
            transcript: None,
        }
    }

    #[test]
    fn infra_failures_and_skips_are_masked() {
        let r = summarize(
            1,
            &[
                rec(true, 30.0, 3, false, false),
                rec(false, -10.0, 5, false, false),
                rec(false, 0.0, 2, true, false),
                rec(false, 0.0, 0, false, true),
                EpisodeRecord {
                    skipped_not_applicable: true,
                    reset_ms: None,
                    ..rec(false, 0.0, 0, false, false)
                },
                // The agent's failure is a failed episode: counted, not masked.
                EpisodeRecord {
                    agent_failure: true,
                    ..rec(false, -2.0, 0, false, false)
                },
            ],
            2.0,
        );
        assert_eq!(r.episodes, 6);
        assert_eq!(r.agent_failures, 1);
        assert_eq!(r.skipped_not_applicable, 1);
        assert_eq!(r.infra_failures, 1);
        assert_eq!(r.skipped_uncertified, 1);
        assert_eq!(r.steps, 10);
        assert_eq!(r.steps_per_s, 5.0);
        assert_eq!(r.success_rate, 1.0 / 3.0);
        assert_eq!(r.mean_return, 6.0);
        assert_eq!(r.reset_ms_median, 2.0);
        let none = summarize(1, &[rec(false, 0.0, 0, false, true)], 1.0);
        assert!(none.success_rate.is_nan());
        let i = Interval::of_finite(&[0.5, f64::NAN, 0.7]);
        assert!((i.mean - 0.6).abs() < 1e-12);
    }

    #[test]
    fn intervals_use_student_t() {
        let i = Interval::of(&[1.0, 2.0, 3.0]);
        assert_eq!(i.mean, 2.0);
        assert!((i.ci95 - 4.303 * (1.0f64 / 3.0).sqrt()).abs() < 1e-9);
        assert!(Interval::of(&[5.0]).ci95.is_nan());
    }
}
