//! Parameter initialisation: orthogonal weights (as PyTorch's `orthogonal_`) and zero biases.
//!
//! Networks are built through a candle `VarBuilder` with zero placeholders and record an
//! [`InitPlan`] (parameter name, kind, gain) in construction order; [`apply`] then fills
//! the `VarMap` from a seeded generator. The plan order makes initialisation deterministic.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use rand_distr::{Distribution, StandardNormal};

use crate::rng::Rng;

/// Errors of initialisation.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The plan names a parameter that the `VarMap` does not hold.
    #[error("init: parameter `{name}` is not in the VarMap")]
    MissingParam {
        /// The parameter name.
        name: String,
    },
    /// An orthogonal init was asked for a tensor that is not a matrix.
    #[error("init: parameter `{name}` has shape {shape:?}; orthogonal init needs 2 dims")]
    NotMatrix {
        /// The parameter name.
        name: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A candle error while writing the parameter.
    #[error("init: candle error on `{name}`: {source}")]
    Candle {
        /// The parameter name.
        name: String,
        /// The underlying error.
        source: candle_core::Error,
    },
}

/// How one parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum InitKind {
    /// Orthogonal matrix scaled by `gain`.
    Orthogonal {
        /// The scale (sqrt(2) hidden, 0.01 policy head, 1.0 value head).
        gain: f64,
    },
    /// All zeros (biases).
    Zeros,
}

/// One entry of an initialisation plan.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInit {
    /// The full parameter name in the `VarMap` (e.g. `actor.l0.weight`).
    pub name: String,
    /// How to initialise it.
    pub kind: InitKind,
}

/// A list of parameters to initialise, in construction order.
pub type InitPlan = Vec<ParamInit>;

/// A `rows x cols` matrix (row-major) with orthonormal rows or columns (whichever are
/// fewer), times `gain`: QR of a standard Gaussian matrix with the signs of R's diagonal
/// folded into Q, as `torch.nn.init.orthogonal_`. QR is modified Gram-Schmidt in f64 with
/// a second re-orthogonalisation pass.
pub fn orthogonal(rows: usize, cols: usize, gain: f64, rng: &mut Rng) -> Vec<f32> {
    if rows == 0 || cols == 0 {
        return Vec::new();
    }
    // Work on a tall matrix n x m (n >= m); its m columns are orthonormalised.
    let (n, m) = if rows >= cols {
        (rows, cols)
    } else {
        (cols, rows)
    };
    // Column-major storage: a[j] is column j (length n).
    let mut a: Vec<Vec<f64>> = (0..m)
        .map(|_| (0..n).map(|_| StandardNormal.sample(rng)).collect())
        .collect();
    for j in 0..m {
        for _pass in 0..2 {
            for k in 0..j {
                let (done, rest) = a.split_at_mut(j);
                let q = &done[k];
                let v = &mut rest[0];
                let dot: f64 = q.iter().zip(v.iter()).map(|(x, y)| x * y).sum();
                for (vi, qi) in v.iter_mut().zip(q.iter()) {
                    *vi -= dot * qi;
                }
            }
        }
        let norm = a[j].iter().map(|x| x * x).sum::<f64>().sqrt();
        // A Gaussian column is linearly dependent on the previous ones with probability 0;
        // guard anyway so no NaN can be produced.
        let norm = if norm > 0.0 { norm } else { 1.0 };
        for x in a[j].iter_mut() {
            *x /= norm;
        }
    }
    let mut out = vec![0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            // Tall case: out[r][c] = Q[r][c]; wide case: out = Q^T, out[r][c] = Q[c][r].
            let v = if rows >= cols { a[c][r] } else { a[r][c] };
            out[r * cols + c] = (v * gain) as f32;
        }
    }
    out
}

/// Fill every parameter of `plan` in `varmap`, in plan order, drawing from `rng`.
pub fn apply(varmap: &VarMap, plan: &[ParamInit], rng: &mut Rng) -> Result<(), InitError> {
    let data = varmap.data().lock().map_err(|_| InitError::MissingParam {
        name: "<VarMap lock poisoned>".to_string(),
    })?;
    for p in plan {
        let var = data.get(&p.name).ok_or_else(|| InitError::MissingParam {
            name: p.name.clone(),
        })?;
        let shape = var.dims().to_vec();
        let cand = |source| InitError::Candle {
            name: p.name.clone(),
            source,
        };
        let value = match p.kind {
            InitKind::Zeros => Tensor::zeros(shape.as_slice(), DType::F32, &Device::Cpu),
            InitKind::Orthogonal { gain } => {
                if shape.len() != 2 {
                    return Err(InitError::NotMatrix {
                        name: p.name.clone(),
                        shape,
                    });
                }
                let w = orthogonal(shape[0], shape[1], gain, rng);
                Tensor::from_vec(w, (shape[0], shape[1]), &Device::Cpu)
            }
        }
        .map_err(cand)?;
        let value = value.to_device(var.device()).map_err(cand)?;
        var.set(&value).map_err(cand)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;

    fn gram(w: &[f32], rows: usize, cols: usize, by_rows: bool) -> Vec<f64> {
        let k = if by_rows { rows } else { cols };
        let mut g = vec![0f64; k * k];
        for i in 0..k {
            for j in 0..k {
                let mut s = 0f64;
                if by_rows {
                    for c in 0..cols {
                        s += f64::from(w[i * cols + c]) * f64::from(w[j * cols + c]);
                    }
                } else {
                    for r in 0..rows {
                        s += f64::from(w[r * cols + i]) * f64::from(w[r * cols + j]);
                    }
                }
                g[i * k + j] = s;
            }
        }
        g
    }

    #[test]
    fn square_orthogonal_has_identity_gram_times_gain_squared() {
        let mut rng = seeded(1);
        let gain = 2f64.sqrt();
        let w = orthogonal(16, 16, gain, &mut rng);
        let g = gram(&w, 16, 16, false);
        for i in 0..16 {
            for j in 0..16 {
                let want = if i == j { 2.0 } else { 0.0 };
                assert!(
                    (g[i * 16 + j] - want).abs() < 1e-5,
                    "gram[{i}][{j}] = {}",
                    g[i * 16 + j]
                );
            }
        }
    }

    #[test]
    fn wide_matrix_has_orthonormal_rows_and_tall_has_orthonormal_columns() {
        let mut rng = seeded(2);
        // Policy head shape: 3 outputs x 64 inputs, gain 0.01.
        let w = orthogonal(3, 64, 0.01, &mut rng);
        let g = gram(&w, 3, 64, true);
        for i in 0..3 {
            for j in 0..3 {
                let want = if i == j { 1e-4 } else { 0.0 };
                assert!((g[i * 3 + j] - want).abs() < 1e-9);
            }
        }
        // Input layer of a small net: 64 outputs x 4 inputs: columns orthonormal.
        let w = orthogonal(64, 4, 1.0, &mut rng);
        let g = gram(&w, 64, 4, false);
        for i in 0..4 {
            for j in 0..4 {
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((g[i * 4 + j] - want).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn entries_have_zero_mean_and_variance_gain_sq_over_n() {
        // For an n x n orthogonal matrix each entry has variance 1/n; over 256^2 entries the
        // sample mean is within a few 1/sqrt(n^2 * n) of 0.
        let mut rng = seeded(3);
        let n = 256;
        let w = orthogonal(n, n, 1.0, &mut rng);
        let mean = w.iter().map(|&x| f64::from(x)).sum::<f64>() / (n * n) as f64;
        let var = w
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / (n * n) as f64;
        assert!(mean.abs() < 1e-3, "mean {mean}");
        // Exactly: sum of squares = n, so var = 1/n - mean^2.
        assert!((var - 1.0 / n as f64).abs() < 1e-5, "var {var}");
    }

    #[test]
    fn same_seed_same_matrix_and_different_seed_differs() {
        let a = orthogonal(8, 5, 1.0, &mut seeded(9));
        let b = orthogonal(8, 5, 1.0, &mut seeded(9));
        let c = orthogonal(8, 5, 1.0, &mut seeded(10));
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
