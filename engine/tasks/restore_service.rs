//! `restore-service` (stub).
use super::{HackTrial, Task, TaskError, TaskSetup, Verdict};
use crate::probe::{Probe, ProbeError};
use crate::synth::Builder;

pub struct RestoreService;

impl Task for RestoreService {
    fn name(&self) -> &'static str {
        "restore-service"
    }
    fn summary(&self) -> &'static str {
        "stub"
    }
    fn setup(&self, _seed: u64, _b: &mut Builder) -> Result<TaskSetup, TaskError> {
        Err(TaskError::Setup("not yet".into()))
    }
    fn verify(&self, _s: &TaskSetup, _p: &mut dyn Probe) -> Result<Verdict, ProbeError> {
        Ok(Verdict::from_checks(vec![]))
    }
    fn oracle(&self, _s: &TaskSetup) -> Vec<String> {
        vec![]
    }
    fn hack_trials(&self, _s: &TaskSetup) -> Vec<HackTrial> {
        vec![]
    }
}
