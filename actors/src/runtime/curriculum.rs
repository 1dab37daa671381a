//! The curriculum scheduler's actor: the level buffer picks levels and takes scores.

use super::call;
use super::role_actor::RoleActor;
use crate::msg::{EpisodeOutcome, Pick};
use crate::roles::{Curriculum, RoleError};
use actix::{Addr, Handler, Message};
use std::path::{Path, PathBuf};

pub struct PickNext;
impl Message for PickNext {
    type Result = Result<(Pick, usize), RoleError>;
}

pub struct Update(pub EpisodeOutcome);
impl Message for Update {
    type Result = Result<usize, RoleError>;
}

pub struct SaveBuffer(pub PathBuf);
impl Message for SaveBuffer {
    type Result = Result<(), RoleError>;
}

type CurriculumActor = RoleActor<dyn Curriculum>;

impl Handler<PickNext> for CurriculumActor {
    type Result = Result<(Pick, usize), RoleError>;
    fn handle(&mut self, _: PickNext, _: &mut Self::Context) -> Self::Result {
        let c = self.get()?;
        Ok((c.pick()?, c.len()))
    }
}

impl Handler<Update> for CurriculumActor {
    type Result = Result<usize, RoleError>;
    fn handle(&mut self, m: Update, _: &mut Self::Context) -> Self::Result {
        let c = self.get()?;
        c.update(&m.0)?;
        Ok(c.len())
    }
}

impl Handler<SaveBuffer> for CurriculumActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: SaveBuffer, _: &mut Self::Context) -> Self::Result {
        self.get()?.save(&m.0)
    }
}

/// A [`Curriculum`] whose calls are messages to its actor (it remembers the buffer's size
/// from the last answer).
pub struct CurriculumProxy {
    addr: Addr<CurriculumActor>,
    len: usize,
}

impl CurriculumProxy {
    pub fn start(inner: Box<dyn Curriculum>) -> Self {
        let len = inner.len();
        Self {
            addr: CurriculumActor::start("curriculum", inner),
            len,
        }
    }
}

impl Curriculum for CurriculumProxy {
    fn pick(&mut self) -> Result<Pick, RoleError> {
        let (p, len) = call("curriculum", &self.addr, PickNext)??;
        self.len = len;
        Ok(p)
    }

    fn update(&mut self, outcome: &EpisodeOutcome) -> Result<(), RoleError> {
        self.len = call("curriculum", &self.addr, Update(outcome.clone()))??;
        Ok(())
    }

    fn len(&self) -> usize {
        self.len
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        call("curriculum", &self.addr, SaveBuffer(dir.to_path_buf()))?
    }
}
