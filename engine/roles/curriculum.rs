//! `actors::roles::Curriculum` over the prioritised level buffer of `policies` (robust PLR's
//! rank prioritisation with staleness): a pick replays a buffered level or asks for a fresh
//! one; each counted episode scores its level by positive value loss (GAE advantages of the
//! episode from its rewards and the agent's values) or MaxMC.

use super::{read_state, write_state, RolesError};
use actors::msg::{EpisodeOutcome, Level, Pick};
use actors::roles::{Curriculum, RoleError};
use policies::curriculum::{
    max_mc, positive_value_loss, Decision, LevelBuffer, LevelBufferConfig, LevelBufferState,
};
use std::path::Path;

const ROLE: &str = "curriculum";

/// How a level is scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreKind {
    PositiveValueLoss,
    MaxMc,
}

/// The whole buffer and its generator (`buffer.json`).
#[derive(serde::Serialize, serde::Deserialize)]
struct SavedBuffer {
    buffer: LevelBufferState<Level>,
    rng: policies::rng::RngState,
}

const BUFFER_STATE: &str = "buffer.json";

pub struct BufferRole {
    buf: LevelBuffer<Level>,
    rng: policies::rng::Rng,
    score: ScoreKind,
    gamma: f64,
    lambda: f64,
}

impl BufferRole {
    pub fn new(
        cfg: LevelBufferConfig,
        score: ScoreKind,
        gamma: f64,
        lambda: f64,
        seed: u64,
    ) -> Result<Self, RolesError> {
        Ok(Self {
            buf: LevelBuffer::new(cfg)?,
            rng: policies::rng::seeded(seed),
            score,
            gamma,
            lambda,
        })
    }

    /// The buffer saved under `dir` (by [`Curriculum::save`]); it must have been made with
    /// `cfg` (a checkpoint of other buffer settings is refused).
    pub fn load(
        dir: &Path,
        cfg: &LevelBufferConfig,
        score: ScoreKind,
        gamma: f64,
        lambda: f64,
    ) -> Result<Self, RolesError> {
        let st: SavedBuffer = read_state(dir, BUFFER_STATE)?;
        if st.buffer.config() != cfg {
            return Err(RolesError::checkpoint(
                dir,
                "the level buffer's settings differ from this run's",
            ));
        }
        Ok(Self {
            buf: LevelBuffer::from_state(st.buffer)?,
            rng: st.rng.restore(),
            score,
            gamma,
            lambda,
        })
    }

    /// GAE advantages of one episode (no bootstrap past a terminal step; a truncated
    /// episode bootstraps from its last value estimate).
    fn advantages(&self, o: &EpisodeOutcome) -> Vec<f32> {
        let n = o.rewards.len().min(o.values.len());
        let mut adv = vec![0f32; n];
        let mut next_v = if o.truncated {
            o.values.last().copied().unwrap_or(0.0)
        } else {
            0.0
        };
        let mut carry = 0f64;
        for t in (0..n).rev() {
            let delta =
                f64::from(o.rewards[t]) + self.gamma * f64::from(next_v) - f64::from(o.values[t]);
            carry = delta + self.gamma * self.lambda * carry;
            adv[t] = carry as f32;
            next_v = o.values[t];
        }
        adv
    }
}

impl Curriculum for BufferRole {
    fn pick(&mut self) -> Result<Pick, RoleError> {
        Ok(match self.buf.decide(&mut self.rng) {
            Decision::Replay(l) => Pick::Replay(l),
            Decision::New => Pick::Fresh,
        })
    }

    fn update(&mut self, o: &EpisodeOutcome) -> Result<(), RoleError> {
        if !o.counted() || o.values.is_empty() {
            return Ok(());
        }
        let err = |e| RoleError::wrap(ROLE, e);
        let score = match self.score {
            ScoreKind::PositiveValueLoss => {
                positive_value_loss(&self.advantages(o)).map_err(err)?
            }
            ScoreKind::MaxMc => {
                let best = self
                    .buf
                    .max_return(&o.level)
                    .unwrap_or(f64::NEG_INFINITY)
                    .max(o.ret);
                max_mc(best, &o.values).map_err(err)?
            }
        };
        self.buf.update(o.level.clone(), score).map_err(err)?;
        if self.buf.score(&o.level).is_some() {
            self.buf.record_return(&o.level, o.ret).map_err(err)?;
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.buf.len()
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        let levels: Vec<(Level, Option<f64>)> = self
            .buf
            .keys()
            .into_iter()
            .map(|k| {
                let s = self.buf.score(&k);
                (k, s)
            })
            .collect();
        write_state(ROLE, dir, "levels.json", &levels)?;
        let st = SavedBuffer {
            buffer: self.buf.state(),
            rng: policies::rng::RngState::capture(&self.rng),
        };
        write_state(ROLE, dir, BUFFER_STATE, &st)
    }
}
