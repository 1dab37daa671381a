//! The realism critic's actor: scores levels (log D), learns on generated ones, saves.

use super::call;
use super::role_actor::RoleActor;
use crate::msg::{LearnStats, Level};
use crate::roles::{Critic, RoleError};
use actix::{Addr, Handler, Message};
use std::path::{Path, PathBuf};

pub struct Realism(pub Vec<Level>);
impl Message for Realism {
    type Result = Result<Vec<f64>, RoleError>;
}

pub struct LearnGenerated(pub Vec<Level>);
impl Message for LearnGenerated {
    type Result = Result<LearnStats, RoleError>;
}

pub struct SaveCritic(pub PathBuf);
impl Message for SaveCritic {
    type Result = Result<(), RoleError>;
}

type CriticActor = RoleActor<dyn Critic>;

impl Handler<Realism> for CriticActor {
    type Result = Result<Vec<f64>, RoleError>;
    fn handle(&mut self, m: Realism, _: &mut Self::Context) -> Self::Result {
        self.get()?.realism(&m.0)
    }
}

impl Handler<LearnGenerated> for CriticActor {
    type Result = Result<LearnStats, RoleError>;
    fn handle(&mut self, m: LearnGenerated, _: &mut Self::Context) -> Self::Result {
        self.get()?.learn(&m.0)
    }
}

impl Handler<SaveCritic> for CriticActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: SaveCritic, _: &mut Self::Context) -> Self::Result {
        self.get()?.save(&m.0)
    }
}

/// A [`Critic`] whose calls are messages to its actor.
pub struct CriticProxy {
    addr: Addr<CriticActor>,
}

impl CriticProxy {
    pub fn start(inner: Box<dyn Critic>) -> Self {
        Self {
            addr: CriticActor::start("critic", inner),
        }
    }
}

impl Critic for CriticProxy {
    fn realism(&mut self, levels: &[Level]) -> Result<Vec<f64>, RoleError> {
        call("critic", &self.addr, Realism(levels.to_vec()))?
    }

    fn learn(&mut self, generated: &[Level]) -> Result<LearnStats, RoleError> {
        call("critic", &self.addr, LearnGenerated(generated.to_vec()))?
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        call("critic", &self.addr, SaveCritic(dir.to_path_buf()))?
    }
}
