//! ACCEL (Parker-Holder et al. 2022): robust PLR (`plr.rs`) whose replayed levels are also
//! edited ([`LevelSpace::mutate`](crate::space::LevelSpace::mutate): one or two fault
//! choices changed, the task seed kept) into new candidates: each replay queues a mutation
//! of its level, and fresh picks play the queued mutations first (only to be scored, like
//! every fresh level), then domain-randomised levels.

use super::plr::Replayed;
use super::{Method, ScheduleConfig};

pub struct Accel;

impl Accel {
    #[allow(clippy::new_ret_no_self)]
    pub fn new(cfg: &ScheduleConfig, workers: usize) -> Replayed {
        Replayed::with(Method::Accel, cfg, workers)
    }
}
