//! Tool-output mutation.

use crate::perturb::Perturbation;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![]
}
