//! `actors::roles::EnvWorker` over an [`Env`]: a level becomes its plan, catalogue indices go
//! in, features and the catalogue mask come out, and failures are told apart: a level that
//! cannot be used (uncertified, not solvable through the catalogue, not applicable, wider
//! than the policy) is `Unusable`; the sandbox, the cache or a verifier read failing is
//! `Infrastructure` (the runtime then restarts the worker with a fresh `Env`).

use super::FaultSpace;
use crate::env::{Action, Env, EnvError};
use actors::msg::{Failure, FailureKind, Level, Start, StepResult, Transition};
use actors::roles::EnvWorker;
use std::sync::Arc;

pub struct EnvRole {
    env: Env,
    space: Arc<FaultSpace>,
    /// The policy's action count; a level's own catalogue is a prefix of it.
    width: usize,
    level_actions: usize,
}

impl EnvRole {
    pub fn new(env: Env, space: Arc<FaultSpace>, width: usize) -> Self {
        Self {
            env,
            space,
            width,
            level_actions: width,
        }
    }

    /// The environment (tests reach its sandbox through it).
    pub fn env(&self) -> &Env {
        &self.env
    }

    pub fn env_mut(&mut self) -> &mut Env {
        &mut self.env
    }

    fn failure(e: &EnvError, level: &Level) -> Failure {
        let kind = if e.skips_level() {
            FailureKind::Unusable
        } else {
            // Everything else the Env can answer here is not the agent's doing either: the
            // episode is masked and the worker started afresh.
            FailureKind::Infrastructure
        };
        Failure::new(kind, format!("level {}: {e}", level.key()))
    }

    fn mask(&self) -> Vec<f32> {
        crate::agents::catalogue_mask(self.width, self.level_actions)
    }
}

impl EnvWorker for EnvRole {
    fn reset(&mut self, level: &Level) -> Result<Start, Failure> {
        if let Err(e) = self.space.space.check(level) {
            return Err(Failure::new(FailureKind::Unusable, e.to_string()));
        }
        let plan = self.space.plan(level);
        let obs = self
            .env
            .reset(&plan)
            .map_err(|e| Self::failure(&e, level))?;
        let n = self.env.task().map_or(0, |t| t.actions.len());
        if n == 0 || n > self.width {
            return Err(Failure::new(
                FailureKind::Unusable,
                format!(
                    "level {} of task `{}` has {n} catalogue actions; the policy has {}",
                    level.key(),
                    plan.task.as_ref().map_or("", |t| t.name.as_str()),
                    self.width
                ),
            ));
        }
        self.level_actions = n;
        Ok(Start {
            obs: obs.features,
            mask: self.mask(),
        })
    }

    fn step(&mut self, action: u32) -> StepResult {
        let index = action as usize;
        if index >= self.level_actions {
            // The mask forbids it; a policy that picks it anyway is a bug, not a fault.
            return Err(Failure::new(
                FailureKind::Crash,
                format!(
                    "action {index} is masked on a level with {} actions",
                    self.level_actions
                ),
            ));
        }
        match self.env.step(&Action::Index(index)) {
            Ok(s) if s.info.infra_failure => Err(Failure::new(
                FailureKind::Infrastructure,
                format!(
                    "instance {}: the environment failed during the step",
                    self.env.instance_id().unwrap_or("?")
                ),
            )),
            Ok(s) => Ok(Transition {
                obs: s.observation.features,
                mask: self.mask(),
                reward: s.reward as f32,
                terminated: s.terminated,
                truncated: s.truncated,
                success: s.info.success,
                progress: s.info.progress as f32,
            }),
            Err(e) => Err(Failure::new(
                if e.is_infrastructure() {
                    FailureKind::Infrastructure
                } else {
                    FailureKind::Crash
                },
                format!("instance {}: {e}", self.env.instance_id().unwrap_or("?")),
            )),
        }
    }
}
