//! TODO family

use super::Perturbation;

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![]
}
