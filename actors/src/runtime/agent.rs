//! The agent actor (protagonist, antagonist): acts on batches, records, learns, saves.

use super::call;
use super::role_actor::RoleActor;
use crate::msg::{Acted, LearnStats, Recorded};
use crate::roles::{Agent, RoleError};
use actix::{Addr, Handler, Message};
use std::path::{Path, PathBuf};

pub struct Act {
    pub obs: Vec<f32>,
    pub masks: Vec<f32>,
    pub n: usize,
}
impl Message for Act {
    type Result = Result<Acted, RoleError>;
}

pub struct Record(pub Recorded);
impl Message for Record {
    type Result = Result<(), RoleError>;
}

pub struct Learn {
    pub next_obs: Vec<f32>,
    pub n: usize,
}
impl Message for Learn {
    type Result = Result<LearnStats, RoleError>;
}

pub struct Save(pub PathBuf);
impl Message for Save {
    type Result = Result<(), RoleError>;
}

type AgentActor = RoleActor<dyn Agent>;

impl Handler<Act> for AgentActor {
    type Result = Result<Acted, RoleError>;
    fn handle(&mut self, m: Act, _: &mut Self::Context) -> Self::Result {
        self.get()?.act(&m.obs, &m.masks, m.n)
    }
}

impl Handler<Record> for AgentActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: Record, _: &mut Self::Context) -> Self::Result {
        self.get()?.record(&m.0)
    }
}

impl Handler<Learn> for AgentActor {
    type Result = Result<LearnStats, RoleError>;
    fn handle(&mut self, m: Learn, _: &mut Self::Context) -> Self::Result {
        self.get()?.learn(&m.next_obs, m.n)
    }
}

impl Handler<Save> for AgentActor {
    type Result = Result<(), RoleError>;
    fn handle(&mut self, m: Save, _: &mut Self::Context) -> Self::Result {
        self.get()?.save(&m.0)
    }
}

/// An [`Agent`] whose calls are messages to its actor.
pub struct AgentProxy {
    role: &'static str,
    addr: Addr<AgentActor>,
    rollout_len: usize,
}

impl AgentProxy {
    /// Start `agent` in its actor (inside a running actix system).
    pub fn start(role: &'static str, agent: Box<dyn Agent>) -> Self {
        let rollout_len = agent.rollout_len();
        Self {
            role,
            addr: AgentActor::start(role, agent),
            rollout_len,
        }
    }
}

impl Agent for AgentProxy {
    fn rollout_len(&self) -> usize {
        self.rollout_len
    }

    fn act(&mut self, obs: &[f32], masks: &[f32], n: usize) -> Result<Acted, RoleError> {
        let m = Act {
            obs: obs.to_vec(),
            masks: masks.to_vec(),
            n,
        };
        call(self.role, &self.addr, m)?
    }

    fn record(&mut self, step: &Recorded) -> Result<(), RoleError> {
        call(self.role, &self.addr, Record(step.clone()))?
    }

    fn learn(&mut self, next_obs: &[f32], n: usize) -> Result<LearnStats, RoleError> {
        let m = Learn {
            next_obs: next_obs.to_vec(),
            n,
        };
        call(self.role, &self.addr, m)?
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        call(self.role, &self.addr, Save(dir.to_path_buf()))?
    }
}
