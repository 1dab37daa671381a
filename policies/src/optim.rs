//! Optimisation: Adam over named candle `Var`s (moments exportable for checkpoints),
//! global gradient-norm clipping and the linear learning-rate schedule.

use candle_core::{backprop::GradStore, Tensor, Var};
use candle_nn::VarMap;
use serde::{Deserialize, Serialize};

/// Errors of the optimiser.
#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// The global gradient norm is NaN or infinite: training would be silently corrupted.
    #[error("optim: gradient norm is {norm} (non-finite); largest offender `{param}`")]
    NonFiniteGradient {
        /// The norm.
        norm: f64,
        /// The parameter with a non-finite or largest gradient.
        param: String,
    },
    /// Restored optimiser state does not fit the parameters.
    #[error("optim state: `{param}`: {reason}")]
    StateMismatch {
        /// The parameter.
        param: String,
        /// Why.
        reason: String,
    },
    /// A configuration value is invalid.
    #[error("optim config: `{field}` {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The VarMap lock was poisoned by a panic elsewhere.
    #[error("optim: VarMap lock poisoned")]
    Poisoned,
    /// A candle error.
    #[error("optim: candle: {0}")]
    Candle(#[from] candle_core::Error),
}

/// Adam hyper-parameters (PyTorch semantics, no weight decay).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamConfig {
    /// Base learning rate (the schedule multiplies it).
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon (1e-5 for PPO).
    pub eps: f64,
}

impl Default for AdamConfig {
    fn default() -> Self {
        Self {
            lr: 2.5e-4,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-5,
        }
    }
}

impl AdamConfig {
    fn validate(&self) -> Result<(), OptimError> {
        let bad = |field, reason: &str| {
            Err(OptimError::InvalidConfig {
                field,
                reason: reason.into(),
            })
        };
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            return bad("lr", "must be finite and >= 0");
        }
        if !(0.0..1.0).contains(&self.beta1) {
            return bad("beta1", "must be in [0, 1)");
        }
        if !(0.0..1.0).contains(&self.beta2) {
            return bad("beta2", "must be in [0, 1)");
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return bad("eps", "must be finite and > 0");
        }
        Ok(())
    }
}

/// One moment tensor, host side, for checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MomentState {
    /// Parameter name.
    pub name: String,
    /// Shape.
    pub shape: Vec<usize>,
    /// First moment, row-major.
    pub m: Vec<f32>,
    /// Second moment, row-major.
    pub v: Vec<f32>,
}

/// Everything Adam needs to continue exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdamState {
    /// Hyper-parameters.
    pub config: AdamConfig,
    /// Number of steps taken.
    pub t: u64,
    /// Moments per parameter, sorted by name.
    pub moments: Vec<MomentState>,
}

/// Adam: `m = b1 m + (1-b1) g`, `v = b2 v + (1-b2) g^2`,
/// `p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps)`.
#[derive(Debug)]
pub struct Adam {
    config: AdamConfig,
    params: Vec<(String, Var)>,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    t: u64,
}

/// Every variable of `varmap`, sorted by name (a `VarMap` iterates in random order).
pub fn sorted_vars(varmap: &VarMap) -> Result<Vec<(String, Var)>, OptimError> {
    let data = varmap.data().lock().map_err(|_| OptimError::Poisoned)?;
    let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(v)
}

impl Adam {
    /// An optimiser over every variable of `varmap`, moments at zero.
    pub fn new(varmap: &VarMap, config: AdamConfig) -> Result<Self, OptimError> {
        config.validate()?;
        let params = sorted_vars(varmap)?;
        let m = params
            .iter()
            .map(|(_, p)| p.as_tensor().zeros_like())
            .collect::<Result<Vec<_>, _>>()?;
        let v = m.clone();
        Ok(Self {
            config,
            params,
            m,
            v,
            t: 0,
        })
    }

    /// The parameters, sorted by name.
    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// Steps taken.
    pub fn steps(&self) -> u64 {
        self.t
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// One step at learning rate `lr`. Parameters without a gradient are left untouched
    /// (their moments too), as in PyTorch.
    pub fn step(&mut self, grads: &GradStore, lr: f64) -> Result<(), OptimError> {
        self.t += 1;
        let c = self.config;
        let t = i32::try_from(self.t).unwrap_or(i32::MAX);
        let bc1 = 1.0 - c.beta1.powi(t);
        let bc2 = 1.0 - c.beta2.powi(t);
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = grads.get(p.as_tensor()) else {
                continue;
            };
            let m = ((&self.m[i] * c.beta1)? + (g * (1.0 - c.beta1))?)?;
            let v = ((&self.v[i] * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
            let denom = ((&v / bc2)?.sqrt()? + c.eps)?;
            let update = ((&m / denom)? * (lr / bc1))?;
            let new = p.as_tensor().sub(&update)?;
            p.set(&new)?;
            self.m[i] = m;
            self.v[i] = v;
        }
        Ok(())
    }

    /// Host copy of the step counter and moments.
    pub fn state(&self) -> Result<AdamState, OptimError> {
        let mut moments = Vec::with_capacity(self.params.len());
        for (i, (name, p)) in self.params.iter().enumerate() {
            moments.push(MomentState {
                name: name.clone(),
                shape: p.dims().to_vec(),
                m: self.m[i].flatten_all()?.to_vec1()?,
                v: self.v[i].flatten_all()?.to_vec1()?,
            });
        }
        Ok(AdamState {
            config: self.config,
            t: self.t,
            moments,
        })
    }

    /// Restore counter, hyper-parameters and moments; names and shapes must match exactly.
    pub fn load_state(&mut self, st: &AdamState) -> Result<(), OptimError> {
        st.config.validate()?;
        if st.moments.len() != self.params.len() {
            return Err(OptimError::StateMismatch {
                param: "<all>".into(),
                reason: format!(
                    "state has {} moments, optimiser has {} parameters",
                    st.moments.len(),
                    self.params.len()
                ),
            });
        }
        let mut m = Vec::with_capacity(self.params.len());
        let mut v = Vec::with_capacity(self.params.len());
        for ((name, p), ms) in self.params.iter().zip(&st.moments) {
            if &ms.name != name {
                return Err(OptimError::StateMismatch {
                    param: name.clone(),
                    reason: format!("state holds `{}` in its place", ms.name),
                });
            }
            let n: usize = p.dims().iter().product();
            if ms.shape != p.dims() || ms.m.len() != n || ms.v.len() != n {
                return Err(OptimError::StateMismatch {
                    param: name.clone(),
                    reason: format!("shape {:?} in state, {:?} in model", ms.shape, p.dims()),
                });
            }
            if let Some(x) = ms.m.iter().chain(&ms.v).find(|x| !x.is_finite()) {
                return Err(OptimError::StateMismatch {
                    param: name.clone(),
                    reason: format!("non-finite moment {x}"),
                });
            }
            m.push(Tensor::from_slice(&ms.m, p.dims(), p.device())?);
            v.push(Tensor::from_slice(&ms.v, p.dims(), p.device())?);
        }
        self.config = st.config;
        self.t = st.t;
        self.m = m;
        self.v = v;
        Ok(())
    }
}

/// Scale all gradients of `params` so that their global L2 norm is at most `max_norm`
/// (PyTorch's `clip_grad_norm_`: factor `max_norm / (norm + 1e-6)` when below 1). Returns
/// the norm before clipping; a non-finite norm is an error naming the worst parameter.
pub fn clip_grad_norm(
    grads: &mut GradStore,
    params: &[(String, Var)],
    max_norm: f64,
) -> Result<f64, OptimError> {
    let mut sq = 0f64;
    let mut worst = (String::new(), -1f64);
    for (name, p) in params {
        if let Some(g) = grads.get(p.as_tensor()) {
            let s = f64::from(g.sqr()?.sum_all()?.to_scalar::<f32>()?);
            let key = if s.is_finite() { s } else { f64::INFINITY };
            if key > worst.1 {
                worst = (name.clone(), key);
            }
            sq += s;
        }
    }
    let norm = sq.sqrt();
    if !norm.is_finite() {
        return Err(OptimError::NonFiniteGradient {
            norm,
            param: worst.0,
        });
    }
    let coef = max_norm / (norm + 1e-6);
    if coef < 1.0 {
        for (_, p) in params {
            if let Some(g) = grads.get(p.as_tensor()) {
                let scaled = (g * coef)?;
                grads.insert(p.as_tensor(), scaled);
            }
        }
    }
    Ok(norm)
}

/// Learning rate linearly annealed from `initial` towards 0 over `total_updates` updates:
/// update `i` (0-based) uses `initial * (1 - i / total_updates)` (CleanRL's schedule).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearSchedule {
    /// Rate of the first update.
    pub initial: f64,
    /// Number of updates over which it decays.
    pub total_updates: u64,
}

impl LinearSchedule {
    /// The rate for 0-based update `i` (never below 0).
    pub fn at(&self, i: u64) -> f64 {
        if self.total_updates == 0 {
            return self.initial;
        }
        let frac = 1.0 - i as f64 / self.total_updates as f64;
        self.initial * frac.max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use candle_nn::{Init, VarBuilder};

    fn one_var(vals: &[f32]) -> (VarMap, Tensor) {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        let t = vb
            .get_with_hints(vals.len(), "w", Init::Const(0.0))
            .unwrap();
        vm.data().lock().unwrap()["w"]
            .set(&Tensor::from_slice(vals, vals.len(), &Device::Cpu).unwrap())
            .unwrap();
        (vm, t)
    }

    #[test]
    fn adam_matches_hand_computed_steps() {
        // Loss = sum(w * c) so the gradient is c, constant.
        let (vm, w) = one_var(&[1.0, -2.0]);
        let cfg = AdamConfig {
            lr: 0.1,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-5,
        };
        let mut adam = Adam::new(&vm, cfg).unwrap();
        let c = Tensor::from_slice(&[0.5f32, -4.0], 2, &Device::Cpu).unwrap();
        for _ in 0..2 {
            let g = (&w * &c).unwrap().sum_all().unwrap().backward().unwrap();
            adam.step(&g, 0.1).unwrap();
        }
        // With constant g, m_hat = g and v_hat = g^2 at every t, so each step moves
        // lr * g / (|g| + eps) = lr * sign(g) * |g| / (|g| + eps).
        let got = vm.data().lock().unwrap()["w"]
            .as_tensor()
            .to_vec1::<f32>()
            .unwrap();
        let step = |g: f64| 0.1 * g / (g.abs() + 1e-5);
        let want = [1.0 - 2.0 * step(0.5), -2.0 - 2.0 * step(-4.0)];
        assert!(
            (f64::from(got[0]) - want[0]).abs() < 1e-6,
            "{got:?} vs {want:?}"
        );
        assert!(
            (f64::from(got[1]) - want[1]).abs() < 1e-6,
            "{got:?} vs {want:?}"
        );
        let st = adam.state().unwrap();
        assert_eq!(st.t, 2);
        // m after 2 steps: (1 - 0.9^2) g = 0.19 g; v: (1 - 0.999^2) g^2.
        assert!((st.moments[0].m[1] - 0.19 * -4.0).abs() < 1e-6);
        assert!((f64::from(st.moments[0].v[1]) - (1.0 - 0.999f64.powi(2)) * 16.0).abs() < 1e-6);
    }

    #[test]
    fn adam_state_roundtrip_and_mismatch() {
        let (vm, w) = one_var(&[1.0, 2.0, 3.0]);
        let mut a = Adam::new(&vm, AdamConfig::default()).unwrap();
        let g = w.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        a.step(&g, 1e-3).unwrap();
        let st = a.state().unwrap();
        let mut b = Adam::new(&vm, AdamConfig::default()).unwrap();
        b.load_state(&st).unwrap();
        assert_eq!(b.state().unwrap(), st);
        let (vm2, _) = one_var(&[1.0, 2.0]);
        let mut c = Adam::new(&vm2, AdamConfig::default()).unwrap();
        let e = c.load_state(&st).unwrap_err().to_string();
        assert!(e.contains("`w`") && e.contains("shape"), "{e}");
    }

    #[test]
    fn clip_grad_norm_scales_to_max_and_reports_pre_clip_norm() {
        let vm = VarMap::new();
        let vb = VarBuilder::from_varmap(&vm, DType::F32, &Device::Cpu);
        let a = vb.get_with_hints(2, "a", Init::Const(0.0)).unwrap();
        let b = vb.get_with_hints(1, "b", Init::Const(0.0)).unwrap();
        // grads: a -> [3, 0], b -> [4]: global norm 5.
        let ca = Tensor::from_slice(&[3f32, 0.0], 2, &Device::Cpu).unwrap();
        let cb = Tensor::from_slice(&[4f32], 1, &Device::Cpu).unwrap();
        let loss = ((&a * &ca).unwrap().sum_all().unwrap()
            + (&b * &cb).unwrap().sum_all().unwrap())
        .unwrap();
        let params = sorted_vars(&vm).unwrap();
        let mut g = loss.backward().unwrap();
        let n = clip_grad_norm(&mut g, &params, 0.5).unwrap();
        assert!((n - 5.0).abs() < 1e-6);
        let ga = g.get(&a).unwrap().to_vec1::<f32>().unwrap();
        let gb = g.get(&b).unwrap().to_vec1::<f32>().unwrap();
        let k = 0.5 / (5.0 + 1e-6);
        assert!((f64::from(ga[0]) - 3.0 * k).abs() < 1e-6 && ga[1] == 0.0);
        assert!((f64::from(gb[0]) - 4.0 * k).abs() < 1e-6);
        // Below the max: untouched.
        let mut g = loss.backward().unwrap();
        clip_grad_norm(&mut g, &params, 10.0).unwrap();
        assert_eq!(g.get(&b).unwrap().to_vec1::<f32>().unwrap(), vec![4.0]);
        // Non-finite gradient: an error naming the parameter.
        let nan = Tensor::from_slice(&[f32::NAN], 1, &Device::Cpu).unwrap();
        let loss = (&b * &nan).unwrap().sum_all().unwrap();
        let mut g = loss.backward().unwrap();
        let e = clip_grad_norm(&mut g, &params, 0.5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`b`"), "{e}");
    }

    #[test]
    fn linear_schedule_anneals_to_zero() {
        let s = LinearSchedule {
            initial: 2.5e-4,
            total_updates: 4,
        };
        let got: Vec<f64> = (0..5).map(|i| s.at(i)).collect();
        let want = [2.5e-4, 1.875e-4, 1.25e-4, 0.625e-4, 0.0];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-15);
        }
        assert_eq!(s.at(9), 0.0);
    }
}
