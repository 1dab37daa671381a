//! The benchmarks behind `engine bench`: [`sandbox`] (sandbox latencies against the host's own
//! `sh -c true`), [`env`] (environment throughput against the raw-exec ceiling) and [`serve`]
//! (a step through `engine serve` against the in-process step, held sessions), [`selfplay`]
//! (the actor runtime against the direct loop of the same schedule), each with its
//! baseline measured in the same run; [`backends`] (the native backend beside the Docker
//! backend, interleaved); [`harbor`] (task folders' whole episodes, native against Docker).
//! The criterion benchmarks are in `benches/`.

pub mod backends;
pub mod env;
pub mod harbor;
pub mod sandbox;
pub mod selfplay;
pub mod serve;

use serde::Serialize;
use std::time::Instant;

/// Median, 90th percentile and count of a sample.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub p90: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_by(f64::total_cmp);
        Self {
            median: quantile(&v, 0.5),
            p90: quantile(&v, 0.9),
            n: v.len(),
        }
    }
}

/// The `q` quantile of a sorted sample (the nearest rank; NaN when empty).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let n = sorted.len();
    if n == 0 {
        return f64::NAN;
    }
    sorted[((q * (n - 1) as f64).round() as usize).min(n - 1)]
}

/// Milliseconds since `t`.
pub(crate) fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_pick_median_and_p90() {
        let s = Summary::of((1..=10).map(f64::from).collect());
        assert_eq!(s.n, 10);
        assert_eq!(s.median, 6.0); // index round(0.5*9)=5 (rounds half away from zero)
        assert_eq!(s.p90, 9.0);
        assert!(Summary::of(vec![]).median.is_nan());
    }
}
