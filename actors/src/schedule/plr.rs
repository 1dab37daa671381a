//! TEMPORARY: replaced by the schedule's implementation before this lands.

use super::{Iteration, Method, Roles, Schedule, ScheduleConfig, ScheduleError};

pub struct Plr;

impl Plr {
    pub fn new(_cfg: &ScheduleConfig, _workers: usize) -> Self {
        Self
    }
}

impl Schedule for Plr {
    fn method(&self) -> Method {
        Method::Plr
    }
    fn updates(&self) -> u64 {
        0
    }
    fn iterate(&mut self, _roles: &mut Roles) -> Result<Iteration, ScheduleError> {
        Err(ScheduleError::Config {
            key: "method",
            reason: "not built yet".into(),
        })
    }
}
