//! The masked multi-categorical distribution: one categorical per action dimension, joint
//! log-probability the sum over dimensions, entropy the sum of entropies.
//!
//! A mask is a 0/1 `f32` tensor shaped like the logits (`[B, sum(action_dims)]`). Masked
//! logits are replaced by [`MASKED_LOGIT`] (the gradient to them is exactly 0), so after the
//! softmax a masked action has probability exactly 0: it is never sampled and contributes
//! nothing to the entropy. Every row must leave at least one valid choice per dimension.

use candle_core::{Tensor, D};
use rand::Rng as _;

use crate::rng::Rng;

/// The logit given to masked actions; `exp(MASKED_LOGIT - max)` underflows to 0 in f32.
pub const MASKED_LOGIT: f64 = -1e9;

/// Errors of the action distribution.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    /// The logits or mask tensor has the wrong shape.
    #[error("dist: `{tensor}` expected shape {expected}, got {got:?}")]
    Shape {
        /// The tensor name.
        tensor: &'static str,
        /// Expected shape in words.
        expected: String,
        /// Actual dims.
        got: Vec<usize>,
    },
    /// A mask entry is neither 0 nor 1.
    #[error("dist: `mask` row {row} column {col} is {value}; masks hold 0 or 1")]
    BadMask {
        /// Row.
        row: usize,
        /// Column (into the concatenated logits).
        col: usize,
        /// The offending value.
        value: f32,
    },
    /// Every choice of one dimension is masked in one row.
    #[error("dist: `mask` row {row} masks every choice of action dimension {dim}")]
    NoValidAction {
        /// Row.
        row: usize,
        /// Action dimension.
        dim: usize,
    },
    /// An action index is out of range or masked.
    #[error("dist: `actions` row {row} dimension {dim}: {reason}")]
    BadAction {
        /// Row.
        row: usize,
        /// Action dimension.
        dim: usize,
        /// Why.
        reason: String,
    },
    /// No action dimensions.
    #[error("dist: at least one action dimension with at least one choice is required")]
    Empty,
    /// A candle error.
    #[error("dist: candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// A multi-discrete action space: the number of choices of each dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MultiCategorical {
    dims: Vec<usize>,
    offsets: Vec<usize>,
    total: usize,
}

/// Per-dimension masked log-probabilities of a batch (`[B, n_d]` each).
#[derive(Debug, Clone)]
pub struct LogProbs {
    /// One `[B, n_d]` tensor of log-probabilities per action dimension.
    pub per_dim: Vec<Tensor>,
}

impl MultiCategorical {
    /// A space with `dims[d]` choices in dimension `d`.
    pub fn new(dims: &[usize]) -> Result<Self, DistError> {
        if dims.is_empty() || dims.contains(&0) {
            return Err(DistError::Empty);
        }
        let mut offsets = Vec::with_capacity(dims.len());
        let mut total = 0;
        for &n in dims {
            offsets.push(total);
            total += n;
        }
        Ok(Self {
            dims: dims.to_vec(),
            offsets,
            total,
        })
    }

    /// Choices per dimension.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// Sum of choices (width of logits and masks).
    pub fn total(&self) -> usize {
        self.total
    }

    /// Validate a host-side mask for `batch` rows: 0/1 values, one valid choice per dim.
    pub fn check_mask(&self, mask: &[f32], batch: usize) -> Result<(), DistError> {
        if mask.len() != batch * self.total {
            return Err(DistError::Shape {
                tensor: "mask",
                expected: format!("[{batch}, {}]", self.total),
                got: vec![mask.len()],
            });
        }
        for row in 0..batch {
            let r = &mask[row * self.total..(row + 1) * self.total];
            for (col, &value) in r.iter().enumerate() {
                if value != 0.0 && value != 1.0 {
                    return Err(DistError::BadMask { row, col, value });
                }
            }
            for (dim, (&off, &n)) in self.offsets.iter().zip(&self.dims).enumerate() {
                if r[off..off + n].iter().all(|&m| m == 0.0) {
                    return Err(DistError::NoValidAction { row, dim });
                }
            }
        }
        Ok(())
    }

    /// Masked log-softmax per dimension. `mask`, when given, must be a checked 0/1 tensor
    /// of the logits' shape.
    pub fn log_probs(&self, logits: &Tensor, mask: Option<&Tensor>) -> Result<LogProbs, DistError> {
        let d = logits.dims();
        if d.len() != 2 || d[1] != self.total {
            return Err(DistError::Shape {
                tensor: "logits",
                expected: format!("[batch, {}]", self.total),
                got: d.to_vec(),
            });
        }
        let logits = match mask {
            Some(m) => {
                if m.dims() != d {
                    return Err(DistError::Shape {
                        tensor: "mask",
                        expected: format!("{d:?}"),
                        got: m.dims().to_vec(),
                    });
                }
                // valid: logit * 1 + 0; masked: logit * 0 + MASKED_LOGIT (zero gradient).
                (logits.mul(m)? + m.affine(-MASKED_LOGIT, MASKED_LOGIT)?)?
            }
            None => logits.clone(),
        };
        let mut per_dim = Vec::with_capacity(self.dims.len());
        for (&off, &n) in self.offsets.iter().zip(&self.dims) {
            let l = logits.narrow(1, off, n)?;
            per_dim.push(candle_nn::ops::log_softmax(&l, D::Minus1)?);
        }
        Ok(LogProbs { per_dim })
    }

    /// Joint log-probability `[B]` of `actions` (`[B, num_dims]`, u32).
    pub fn log_prob(&self, lp: &LogProbs, actions: &Tensor) -> Result<Tensor, DistError> {
        let d = actions.dims();
        if d.len() != 2 || d[1] != self.dims.len() {
            return Err(DistError::Shape {
                tensor: "actions",
                expected: format!("[batch, {}]", self.dims.len()),
                got: d.to_vec(),
            });
        }
        let mut total: Option<Tensor> = None;
        for (i, l) in lp.per_dim.iter().enumerate() {
            let a = actions.narrow(1, i, 1)?.contiguous()?;
            let g = l.gather(&a, 1)?.squeeze(1)?;
            total = Some(match total {
                Some(t) => (t + g)?,
                None => g,
            });
        }
        total.ok_or(DistError::Empty)
    }

    /// Joint entropy `[B]`: sum over dimensions of `-sum p log p` (masked terms are 0).
    pub fn entropy(&self, lp: &LogProbs) -> Result<Tensor, DistError> {
        let mut total: Option<Tensor> = None;
        for l in &lp.per_dim {
            let h = (l.exp()? * l)?.sum(D::Minus1)?.neg()?;
            total = Some(match total {
                Some(t) => (t + h)?,
                None => h,
            });
        }
        total.ok_or(DistError::Empty)
    }

    /// Host-side probabilities, row-major `[B, total]`.
    pub fn probs_host(&self, lp: &LogProbs) -> Result<Vec<f32>, DistError> {
        let batch = lp.per_dim.first().map(|t| t.dims()[0]).unwrap_or(0);
        let mut out = vec![0f32; batch * self.total];
        for ((l, &off), &n) in lp.per_dim.iter().zip(&self.offsets).zip(&self.dims) {
            let v = l.exp()?.to_vec2::<f32>()?;
            for (b, row) in v.iter().enumerate() {
                out[b * self.total + off..b * self.total + off + n].copy_from_slice(row);
            }
        }
        Ok(out)
    }

    /// Sample one action per dimension per row from host probabilities (`[B, total]`, as
    /// from [`Self::probs_host`]). A choice whose mask is 0 or whose probability is 0 is
    /// never returned.
    pub fn sample(&self, probs: &[f32], mask: Option<&[f32]>, rng: &mut Rng) -> Vec<u32> {
        let batch = probs.len() / self.total.max(1);
        let mut out = Vec::with_capacity(batch * self.dims.len());
        for b in 0..batch {
            for (&off, &n) in self.offsets.iter().zip(&self.dims) {
                let base = b * self.total + off;
                let valid =
                    |j: usize| mask.is_none_or(|m| m[base + j] != 0.0) && probs[base + j] > 0.0;
                let u: f32 = rng.gen();
                let mut cum = 0f32;
                let mut chosen = None;
                let mut last_valid = 0;
                for j in 0..n {
                    if !valid(j) {
                        continue;
                    }
                    last_valid = j;
                    cum += probs[base + j];
                    if u < cum {
                        chosen = Some(j);
                        break;
                    }
                }
                // Rounding can leave the cumulative sum just below u: take the last valid.
                out.push(chosen.unwrap_or(last_valid) as u32);
            }
        }
        out
    }

    /// The most probable valid choice per dimension per row (ties: lowest index).
    pub fn mode(&self, probs: &[f32], mask: Option<&[f32]>) -> Vec<u32> {
        let batch = probs.len() / self.total.max(1);
        let mut out = Vec::with_capacity(batch * self.dims.len());
        for b in 0..batch {
            for (&off, &n) in self.offsets.iter().zip(&self.dims) {
                let base = b * self.total + off;
                let mut best = None::<(usize, f32)>;
                for j in 0..n {
                    if mask.is_some_and(|m| m[base + j] == 0.0) {
                        continue;
                    }
                    if best.is_none_or(|(_, p)| probs[base + j] > p) {
                        best = Some((j, probs[base + j]));
                    }
                }
                out.push(best.map_or(0, |(j, _)| j) as u32);
            }
        }
        out
    }

    /// Check that every action is in range and, with a mask, unmasked.
    pub fn check_actions(&self, actions: &[u32], mask: Option<&[f32]>) -> Result<(), DistError> {
        let nd = self.dims.len();
        for (i, &a) in actions.iter().enumerate() {
            let (row, dim) = (i / nd, i % nd);
            if a as usize >= self.dims[dim] {
                return Err(DistError::BadAction {
                    row,
                    dim,
                    reason: format!("index {a} out of range 0..{}", self.dims[dim]),
                });
            }
            if let Some(m) = mask {
                if m[row * self.total + self.offsets[dim] + a as usize] == 0.0 {
                    return Err(DistError::BadAction {
                        row,
                        dim,
                        reason: format!("action {a} is masked"),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;
    use candle_core::{Device, Var};

    fn t2(v: &[f32], r: usize, c: usize) -> Tensor {
        Tensor::from_slice(v, (r, c), &Device::Cpu).unwrap()
    }

    #[test]
    fn log_prob_and_entropy_match_hand_computation() {
        // Dims [2, 3]; logits row: [0, ln 3 | 0, 0, ln 2] -> p = [1/4, 3/4 | 1/4, 1/4, 1/2].
        let mc = MultiCategorical::new(&[2, 3]).unwrap();
        let l3 = 3f32.ln();
        let l2 = 2f32.ln();
        let logits = t2(&[0.0, l3, 0.0, 0.0, l2], 1, 5);
        let lp = mc.log_probs(&logits, None).unwrap();
        let acts = Tensor::from_slice(&[1u32, 2], (1, 2), &Device::Cpu).unwrap();
        let got = mc.log_prob(&lp, &acts).unwrap().to_vec1::<f32>().unwrap()[0];
        let want = (0.75f32).ln() + (0.5f32).ln();
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        let h = mc.entropy(&lp).unwrap().to_vec1::<f32>().unwrap()[0];
        let h1 = -(0.25f32 * 0.25f32.ln() + 0.75 * 0.75f32.ln());
        let h2 = -(2.0 * 0.25f32 * 0.25f32.ln() + 0.5 * 0.5f32.ln());
        assert!((h - (h1 + h2)).abs() < 1e-6);
    }

    #[test]
    fn masked_action_has_zero_probability_zero_gradient_and_is_never_sampled() {
        let mc = MultiCategorical::new(&[3]).unwrap();
        let w = Var::from_tensor(&t2(&[5.0, 0.0, 0.0], 1, 3)).unwrap();
        let mask = t2(&[0.0, 1.0, 1.0], 1, 3);
        let lp = mc.log_probs(w.as_tensor(), Some(&mask)).unwrap();
        let p = mc.probs_host(&lp).unwrap();
        assert_eq!(p[0], 0.0);
        assert!((p[1] - 0.5).abs() < 1e-6 && (p[2] - 0.5).abs() < 1e-6);
        // Entropy over the two valid actions: ln 2, finite gradient, zero at the masked logit.
        let h = mc.entropy(&lp).unwrap();
        assert!((h.to_vec1::<f32>().unwrap()[0] - 2f32.ln()).abs() < 1e-6);
        let acts = Tensor::from_slice(&[1u32], (1, 1), &Device::Cpu).unwrap();
        let loss = (mc.log_prob(&lp, &acts).unwrap() + h)
            .unwrap()
            .sum_all()
            .unwrap();
        let g = loss.backward().unwrap();
        let gw = g.get(w.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(gw[0][0], 0.0);
        assert!(gw[0].iter().all(|x| x.is_finite()));
        // d log p1 / d l1 = 1 - p1 = 0.5, d/d l2 = -0.5; entropy at uniform has zero gradient.
        assert!((gw[0][1] - 0.5).abs() < 1e-6 && (gw[0][2] + 0.5).abs() < 1e-6);
        let mut rng = seeded(0);
        let m = [0.0, 1.0, 1.0];
        let mut counts = [0usize; 3];
        for _ in 0..2000 {
            counts[mc.sample(&p, Some(&m), &mut rng)[0] as usize] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!(counts[1] > 900 && counts[2] > 900, "{counts:?}");
        assert_eq!(mc.mode(&p, Some(&m)), vec![1]);
    }

    #[test]
    fn sampling_frequencies_follow_probabilities() {
        let mc = MultiCategorical::new(&[2, 3]).unwrap();
        let probs = [0.2, 0.8, 0.1, 0.6, 0.3];
        let mut rng = seeded(5);
        let n = 20000;
        let mut c0 = 0;
        let mut c1 = [0usize; 3];
        for _ in 0..n {
            let a = mc.sample(&probs, None, &mut rng);
            c0 += usize::from(a[0] == 1);
            c1[a[1] as usize] += 1;
        }
        // Binomial standard deviations are below 0.004 here; allow 4 sigma.
        assert!((c0 as f64 / n as f64 - 0.8).abs() < 0.012);
        for (k, &p) in [0.1, 0.6, 0.3].iter().enumerate() {
            assert!(
                (c1[k] as f64 / n as f64 - p).abs() < 0.014,
                "{k}: {}",
                c1[k]
            );
        }
    }

    #[test]
    fn bad_masks_and_actions_are_reported() {
        let mc = MultiCategorical::new(&[2, 2]).unwrap();
        let e = mc.check_mask(&[1.0, 1.0, 0.0, 0.0], 1).unwrap_err();
        assert!(
            matches!(e, DistError::NoValidAction { row: 0, dim: 1 }),
            "{e}"
        );
        let e = mc.check_mask(&[1.0, 0.5, 1.0, 1.0], 1).unwrap_err();
        assert!(matches!(e, DistError::BadMask { col: 1, .. }), "{e}");
        let e = mc
            .check_actions(&[0, 1], Some(&[1.0, 1.0, 1.0, 0.0]))
            .unwrap_err();
        assert!(e.to_string().contains("masked"), "{e}");
        let e = mc.check_actions(&[2, 0], None).unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
    }
}
