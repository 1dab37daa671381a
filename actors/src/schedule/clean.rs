//! Clean training: the protagonist learns on unperturbed levels of random task seeds (the
//! DR schedule drawing clean levels).

use super::dr::Sampled;
use super::{Method, ScheduleConfig};

pub struct Clean;

impl Clean {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Sampled {
        Sampled::with(Method::Clean, cfg, workers)
    }
}
