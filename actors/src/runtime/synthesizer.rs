//! The adversary actor: proposes levels, observes the protagonist, learns, saves.

use super::call;
use super::role_actor::RoleActor;
use crate::msg::{EpisodeOutcome, LearnStats, Proposal};
use crate::roles::{RoleError, Synthesizer};
use actix::{Addr, Handler, Message};
use std::path::{Path, PathBuf};

pub struct Propose(pub usize, pub f64);
impl Message for Propose {
    type Result = Result<Vec<Proposal>, RoleError>;
}

pub struct Observe(pub Vec<EpisodeOutcome>);
impl Message for Observe {
    type Result = Result<(), RoleError>;
}

pub struct LearnScored(pub Vec<(Proposal, f64)>);
impl Message for LearnScored {
    type Result = Result<LearnStats, RoleError>;
}

pub struct SaveTo(pub PathBuf);
impl Message for SaveTo {
    type Result = Result<(), RoleError>;
}

type SynthActor = RoleActor<dyn Synthesizer>;

impl Handler<Propose> for SynthActor {
    type Result = Result<Vec<Proposal>, RoleError>;
    fn handle(&mut self, m: Propose, _: &mut Self::Context) -> Self::Result {
        self.get()?.propose(m.0, m.1)
    }
}

impl Handler<Observe> for SynthActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: Observe, _: &mut Self::Context) -> Self::Result {
        self.get()?.observe(&m.0)
    }
}

impl Handler<LearnScored> for SynthActor {
    type Result = Result<LearnStats, RoleError>;
    fn handle(&mut self, m: LearnScored, _: &mut Self::Context) -> Self::Result {
        self.get()?.learn(&m.0)
    }
}

impl Handler<SaveTo> for SynthActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: SaveTo, _: &mut Self::Context) -> Self::Result {
        self.get()?.save(&m.0)
    }
}

/// A [`Synthesizer`] whose calls are messages to its actor.
pub struct SynthesizerProxy {
    addr: Addr<SynthActor>,
}

impl SynthesizerProxy {
    pub fn start(inner: Box<dyn Synthesizer>) -> Self {
        Self {
            addr: SynthActor::start("adversary", inner),
        }
    }
}

impl Synthesizer for SynthesizerProxy {
    fn propose(&mut self, n: usize, budget: f64) -> Result<Vec<Proposal>, RoleError> {
        call("adversary", &self.addr, Propose(n, budget))?
    }

    fn observe(&mut self, outcomes: &[EpisodeOutcome]) -> Result<(), RoleError> {
        call("adversary", &self.addr, Observe(outcomes.to_vec()))?
    }

    fn learn(&mut self, scored: &[(Proposal, f64)]) -> Result<LearnStats, RoleError> {
        call("adversary", &self.addr, LearnScored(scored.to_vec()))?
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        call("adversary", &self.addr, SaveTo(dir.to_path_buf()))?
    }
}
