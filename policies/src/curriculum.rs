//! Curriculum: level scorers (regret estimates, learnability) and a prioritised level
//! buffer generic over the level key (Robust PLR / ACCEL's replay buffer).
//!
//! Replay distribution over the buffer's levels (Jiang et al., "Prioritized Level Replay"):
//! `P = (1 - rho) * P_S + rho * P_C` with
//! * score prioritisation by rank: `P_S(i) = h_i^(1/beta) / sum_j h_j^(1/beta)`,
//!   `h_i = 1 / rank(S_i)` (rank 1 = highest score; ties broken by insertion order);
//! * staleness: `P_C(i) = (c - C_i) / sum_j (c - C_j)`, `c` the number of decisions so
//!   far and `C_i` the decision at which level `i` was last sampled (uniform if all 0).
//!
//! [`LevelBuffer::decide`] replays with probability `replay_prob` once at least `min_fill`
//! levels are scored, and otherwise asks for a new level. Robust PLR: a new level is only
//! evaluated (no gradient update), then scored and offered to the buffer with
//! [`LevelBuffer::update`]; when full, it replaces the lowest-scoring level only if it
//! scores higher.

use std::collections::HashMap;
use std::hash::Hash;

use rand::Rng as _;
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Errors of scorers and the level buffer.
#[derive(Debug, thiserror::Error)]
pub enum CurriculumError {
    /// An input slice is empty.
    #[error("curriculum: `{what}` is empty")]
    Empty {
        /// The input.
        what: &'static str,
    },
    /// An input is NaN or infinite.
    #[error("curriculum: `{what}` has non-finite value {value} at index {index}")]
    NonFinite {
        /// The input.
        what: &'static str,
        /// Index.
        index: usize,
        /// Value.
        value: f64,
    },
    /// A value is outside its range.
    #[error("curriculum: `{what}` is {value}, outside {range}")]
    OutOfRange {
        /// The input.
        what: &'static str,
        /// Value.
        value: f64,
        /// Allowed range.
        range: &'static str,
    },
    /// A saved buffer that cannot be a buffer's state.
    #[error("curriculum: saved buffer: {0}")]
    BadState(String),
}

fn finite<T: Copy + Into<f64>>(what: &'static str, xs: &[T]) -> Result<(), CurriculumError> {
    if xs.is_empty() {
        return Err(CurriculumError::Empty { what });
    }
    for (index, &x) in xs.iter().enumerate() {
        let value: f64 = x.into();
        if !value.is_finite() {
            return Err(CurriculumError::NonFinite { what, index, value });
        }
    }
    Ok(())
}

/// Positive value loss: `mean_t max(A_t, 0)` over an episode's GAE advantages.
pub fn positive_value_loss(advantages: &[f32]) -> Result<f64, CurriculumError> {
    finite("advantages", advantages)?;
    Ok(advantages
        .iter()
        .map(|&a| f64::from(a).max(0.0))
        .sum::<f64>()
        / advantages.len() as f64)
}

/// MaxMC: `mean_t (R_max - V(s_t))`, `R_max` the best return ever seen on the level.
pub fn max_mc(max_return: f64, values: &[f32]) -> Result<f64, CurriculumError> {
    finite("max_return", &[max_return])?;
    finite("values", values)?;
    Ok(values
        .iter()
        .map(|&v| max_return - f64::from(v))
        .sum::<f64>()
        / values.len() as f64)
}

/// Learnability (SFL): `p (1 - p)` for a success rate `p` in `[0, 1]`.
pub fn learnability(p: f64) -> Result<f64, CurriculumError> {
    if !(0.0..=1.0).contains(&p) {
        return Err(CurriculumError::OutOfRange {
            what: "success_rate",
            value: p,
            range: "[0, 1]",
        });
    }
    Ok(p * (1.0 - p))
}

/// PAIRED regret: `max(0, max(antagonist returns) - mean(protagonist returns))`.
pub fn paired_regret(antagonist: &[f32], protagonist: &[f32]) -> Result<f64, CurriculumError> {
    finite("antagonist_returns", antagonist)?;
    finite("protagonist_returns", protagonist)?;
    let best = antagonist
        .iter()
        .map(|&x| f64::from(x))
        .fold(f64::NEG_INFINITY, f64::max);
    let mean = protagonist.iter().map(|&x| f64::from(x)).sum::<f64>() / protagonist.len() as f64;
    Ok((best - mean).max(0.0))
}

/// Configuration of a [`LevelBuffer`] (defaults: Robust PLR's reference values).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelBufferConfig {
    /// Maximum number of levels kept.
    pub capacity: usize,
    /// Rank temperature `beta` (> 0).
    pub temperature: f64,
    /// Staleness mixing `rho` in `[0, 1]`.
    pub staleness_coef: f64,
    /// Probability of replaying once the buffer is filled enough.
    pub replay_prob: f64,
    /// Scored levels needed before any replay.
    pub min_fill: usize,
}

impl Default for LevelBufferConfig {
    fn default() -> Self {
        Self {
            capacity: 4000,
            temperature: 0.3,
            staleness_coef: 0.5,
            replay_prob: 0.8,
            min_fill: 400,
        }
    }
}

impl LevelBufferConfig {
    fn validate(&self) -> Result<(), CurriculumError> {
        if self.capacity == 0 {
            return Err(CurriculumError::OutOfRange {
                what: "capacity",
                value: 0.0,
                range: ">= 1",
            });
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(CurriculumError::OutOfRange {
                what: "temperature",
                value: self.temperature,
                range: "(0, inf)",
            });
        }
        for (what, v) in [
            ("staleness_coef", self.staleness_coef),
            ("replay_prob", self.replay_prob),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(CurriculumError::OutOfRange {
                    what,
                    value: v,
                    range: "[0, 1]",
                });
            }
        }
        Ok(())
    }
}

/// What to play next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision<K> {
    /// Replay this buffered level (train on it).
    Replay(K),
    /// Generate a new level, evaluate it without a gradient update, then score it.
    New,
}

/// What [`LevelBuffer::update`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateOutcome<K> {
    /// The level was already buffered; its score was replaced.
    Rescored,
    /// Added (room was left).
    Inserted,
    /// Added in place of the lowest-scoring level, which is returned.
    Replaced(K),
    /// Not added: the buffer is full and every level scores at least as high.
    Rejected,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry<K> {
    key: K,
    score: f64,
    last_sampled: u64,
    order: u64,
    max_return: Option<f64>,
}

/// A prioritised buffer of levels identified by `K`.
#[derive(Debug, Clone)]
pub struct LevelBuffer<K> {
    cfg: LevelBufferConfig,
    entries: Vec<Entry<K>>,
    index: HashMap<K, usize>,
    decisions: u64,
    inserted: u64,
}

/// A [`LevelBuffer`]'s whole state (for checkpoints): its levels with their scores,
/// staleness and best returns, and its counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelBufferState<K> {
    cfg: LevelBufferConfig,
    entries: Vec<Entry<K>>,
    decisions: u64,
    inserted: u64,
}

impl<K> LevelBufferState<K> {
    /// The settings of the buffer it was taken from.
    pub fn config(&self) -> &LevelBufferConfig {
        &self.cfg
    }
}

impl<K: Clone + Eq + Hash> LevelBuffer<K> {
    /// Its whole state.
    pub fn state(&self) -> LevelBufferState<K> {
        LevelBufferState {
            cfg: self.cfg.clone(),
            entries: self.entries.clone(),
            decisions: self.decisions,
            inserted: self.inserted,
        }
    }

    /// The buffer [`Self::state`] captured, checked (settings in range, at most `capacity`
    /// levels, each once, finite scores).
    pub fn from_state(st: LevelBufferState<K>) -> Result<Self, CurriculumError> {
        st.cfg.validate()?;
        if st.entries.len() > st.cfg.capacity {
            return Err(CurriculumError::BadState(format!(
                "{} levels in a buffer of {}",
                st.entries.len(),
                st.cfg.capacity
            )));
        }
        let mut index = HashMap::with_capacity(st.entries.len());
        for (i, e) in st.entries.iter().enumerate() {
            if !e.score.is_finite() {
                return Err(CurriculumError::BadState(format!(
                    "level {i} scores {}",
                    e.score
                )));
            }
            if index.insert(e.key.clone(), i).is_some() {
                return Err(CurriculumError::BadState(format!(
                    "level {i} is held twice"
                )));
            }
        }
        Ok(Self {
            cfg: st.cfg,
            entries: st.entries,
            index,
            decisions: st.decisions,
            inserted: st.inserted,
        })
    }

    /// An empty buffer.
    pub fn new(cfg: LevelBufferConfig) -> Result<Self, CurriculumError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            entries: Vec::new(),
            index: HashMap::new(),
            decisions: 0,
            inserted: 0,
        })
    }

    /// Levels held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// No level held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Decisions taken so far (`c`).
    pub fn decisions(&self) -> u64 {
        self.decisions
    }

    /// The score of a buffered level.
    pub fn score(&self, key: &K) -> Option<f64> {
        self.index.get(key).map(|&i| self.entries[i].score)
    }

    /// Best return recorded for a level (for [`max_mc`]).
    pub fn max_return(&self, key: &K) -> Option<f64> {
        self.index
            .get(key)
            .and_then(|&i| self.entries[i].max_return)
    }

    /// Record an episode return on a buffered level (keeps the maximum).
    pub fn record_return(&mut self, key: &K, ret: f64) -> Result<(), CurriculumError> {
        finite("return", &[ret])?;
        if let Some(&i) = self.index.get(key) {
            let e = &mut self.entries[i];
            e.max_return = Some(e.max_return.map_or(ret, |m| m.max(ret)));
        }
        Ok(())
    }

    /// Insert or rescore a level. New levels count as sampled at the current decision.
    pub fn update(&mut self, key: K, score: f64) -> Result<UpdateOutcome<K>, CurriculumError> {
        finite("score", &[score])?;
        if let Some(&i) = self.index.get(&key) {
            self.entries[i].score = score;
            return Ok(UpdateOutcome::Rescored);
        }
        let entry = Entry {
            key: key.clone(),
            score,
            last_sampled: self.decisions,
            order: self.inserted,
            max_return: None,
        };
        self.inserted += 1;
        if self.entries.len() < self.cfg.capacity {
            self.index.insert(key, self.entries.len());
            self.entries.push(entry);
            return Ok(UpdateOutcome::Inserted);
        }
        // Lowest score; among equals, the oldest insertion goes first.
        let worst = (0..self.entries.len()).min_by(|&a, &b| {
            let (ea, eb) = (&self.entries[a], &self.entries[b]);
            ea.score.total_cmp(&eb.score).then(ea.order.cmp(&eb.order))
        });
        match worst {
            Some(w) if self.entries[w].score < score => {
                let old = std::mem::replace(&mut self.entries[w], entry);
                self.index.remove(&old.key);
                self.index.insert(key, w);
                Ok(UpdateOutcome::Replaced(old.key))
            }
            _ => Ok(UpdateOutcome::Rejected),
        }
    }

    /// The replay distribution `(1 - rho) P_S + rho P_C`, aligned with [`Self::keys`].
    pub fn replay_distribution(&self) -> Vec<f64> {
        let n = self.entries.len();
        if n == 0 {
            return Vec::new();
        }
        // Ranks: sort by score descending, ties by insertion order.
        let mut by_score: Vec<usize> = (0..n).collect();
        by_score.sort_by(|&a, &b| {
            let (ea, eb) = (&self.entries[a], &self.entries[b]);
            eb.score.total_cmp(&ea.score).then(ea.order.cmp(&eb.order))
        });
        let mut ps = vec![0f64; n];
        for (r, &i) in by_score.iter().enumerate() {
            ps[i] = (1.0 / (r as f64 + 1.0)).powf(1.0 / self.cfg.temperature);
        }
        let zs: f64 = ps.iter().sum();
        let stale: Vec<f64> = self
            .entries
            .iter()
            .map(|e| (self.decisions - e.last_sampled) as f64)
            .collect();
        let zc: f64 = stale.iter().sum();
        let rho = self.cfg.staleness_coef;
        (0..n)
            .map(|i| {
                let pc = if zc > 0.0 {
                    stale[i] / zc
                } else {
                    1.0 / n as f64
                };
                (1.0 - rho) * ps[i] / zs + rho * pc
            })
            .collect()
    }

    /// Keys in storage order (the order of [`Self::replay_distribution`]).
    pub fn keys(&self) -> Vec<K> {
        self.entries.iter().map(|e| e.key.clone()).collect()
    }

    /// Take one decision: replay (with probability `replay_prob`, once `min_fill` levels are
    /// held) a level drawn from the replay distribution, or ask for a new one. Advances the
    /// decision counter; a replayed level's staleness restarts.
    pub fn decide(&mut self, rng: &mut Rng) -> Decision<K> {
        let replay = self.entries.len() >= self.cfg.min_fill.max(1)
            && rng.gen::<f64>() < self.cfg.replay_prob;
        let out = if replay {
            let p = self.replay_distribution();
            let u: f64 = rng.gen();
            let mut cum = 0.0;
            let mut pick = p.len() - 1;
            for (i, &pi) in p.iter().enumerate() {
                cum += pi;
                if u < cum {
                    pick = i;
                    break;
                }
            }
            Decision::Replay(pick)
        } else {
            Decision::New
        };
        self.decisions += 1;
        match out {
            Decision::Replay(i) => {
                self.entries[i].last_sampled = self.decisions;
                Decision::Replay(self.entries[i].key.clone())
            }
            Decision::New => Decision::New,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::seeded;

    #[test]
    fn scorers_match_formulas() {
        assert!((positive_value_loss(&[1.0, -2.0, 3.0, 0.0]).unwrap() - 1.0).abs() < 1e-12);
        assert!((max_mc(10.0, &[4.0, 6.0]).unwrap() - 5.0).abs() < 1e-12);
        assert_eq!(learnability(0.5).unwrap(), 0.25);
        assert_eq!(learnability(1.0).unwrap(), 0.0);
        assert!(learnability(1.5).is_err());
        assert!((paired_regret(&[3.0, 7.0], &[2.0, 4.0]).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(paired_regret(&[1.0], &[5.0]).unwrap(), 0.0);
        let e = positive_value_loss(&[1.0, f32::NAN])
            .unwrap_err()
            .to_string();
        assert!(e.contains("`advantages`") && e.contains("index 1"), "{e}");
        assert!(positive_value_loss(&[]).is_err());
    }

    fn buf(cap: usize, rho: f64, min_fill: usize) -> LevelBuffer<&'static str> {
        LevelBuffer::new(LevelBufferConfig {
            capacity: cap,
            temperature: 0.5,
            staleness_coef: rho,
            replay_prob: 1.0,
            min_fill,
        })
        .unwrap()
    }

    #[test]
    fn a_saved_state_gives_the_same_buffer_and_bad_states_are_refused() {
        let mut b = buf(3, 0.5, 1);
        let mut rng = crate::rng::seeded(4);
        for (k, s) in [("a", 0.1), ("b", 0.9), ("c", 0.5), ("d", 0.7)] {
            b.update(k, s).unwrap();
            b.decide(&mut rng);
        }
        b.record_return(&"b", 2.5).unwrap();
        let st = b.state();
        let json = serde_json::to_string(&st).unwrap();
        let back: LevelBufferState<String> = serde_json::from_str(&json).unwrap();
        let c = LevelBuffer::from_state(back).unwrap();
        assert_eq!(
            c.keys(),
            b.keys().iter().map(|k| k.to_string()).collect::<Vec<_>>()
        );
        assert_eq!(c.replay_distribution(), b.replay_distribution());
        assert_eq!(c.decisions(), b.decisions());
        assert_eq!(c.max_return(&"b".to_string()), Some(2.5));
        // The same decisions from the same generator.
        let (mut r1, mut r2) = (crate::rng::seeded(9), crate::rng::seeded(9));
        let mut c2 = LevelBuffer::from_state(b.state()).unwrap();
        for _ in 0..20 {
            assert_eq!(b.decide(&mut r1), c2.decide(&mut r2));
        }
        let mut twice = c.state();
        twice.entries.push(twice.entries[0].clone());
        twice.cfg.capacity = 10;
        let e = LevelBuffer::from_state(twice).unwrap_err().to_string();
        assert!(e.contains("held twice"), "{e}");
        let mut nan = c.state();
        nan.entries[0].score = f64::NAN;
        assert!(LevelBuffer::from_state(nan).is_err());
        let mut over = c.state();
        over.cfg.capacity = 1;
        assert!(LevelBuffer::from_state(over)
            .unwrap_err()
            .to_string()
            .contains("levels in a buffer of 1"));
    }

    #[test]
    fn rank_distribution_matches_formula() {
        let mut b = buf(10, 0.0, 1);
        b.update("a", 0.1).unwrap();
        b.update("b", 0.9).unwrap();
        b.update("c", 0.5).unwrap();
        // ranks: b=1, c=2, a=3; h^(1/0.5) = h^2 -> 1, 1/4, 1/9; Z = 49/36.
        let p = b.replay_distribution();
        let z = 1.0 + 0.25 + 1.0 / 9.0;
        let want = [1.0 / 9.0 / z, 1.0 / z, 0.25 / z];
        for (g, w) in p.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{p:?}");
        }
    }

    #[test]
    fn staleness_mixing_matches_formula() {
        let mut b = buf(10, 0.5, 100);
        b.update("a", 1.0).unwrap(); // C_a = 0
        let mut rng = seeded(0);
        // min_fill 100 not reached: these decisions are New and only advance c.
        for _ in 0..3 {
            assert_eq!(b.decide(&mut rng), Decision::New);
        }
        b.update("b", 2.0).unwrap(); // C_b = 3
        b.decide(&mut rng); // c = 4
                            // staleness: a 4, b 1 -> P_C = [0.8, 0.2]; ranks: b 1, a 2 -> h^2 = [1/4, 1], P_S = [0.2, 0.8]
        let p = b.replay_distribution();
        let want = [0.5 * 0.2 + 0.5 * 0.8, 0.5 * 0.8 + 0.5 * 0.2];
        for (g, w) in p.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{p:?}");
        }
    }

    #[test]
    fn sampling_frequencies_follow_the_distribution() {
        // rho = 0 so the distribution does not move as levels are sampled.
        let mut b = buf(10, 0.0, 1);
        for (k, s) in [("a", 3.0), ("b", 2.0), ("c", 1.0), ("d", 0.0)] {
            b.update(k, s).unwrap();
        }
        let p = b.replay_distribution();
        let keys = b.keys();
        let mut rng = seeded(1);
        let n = 40_000;
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for _ in 0..n {
            match b.decide(&mut rng) {
                Decision::Replay(k) => *counts.entry(k).or_default() += 1,
                Decision::New => panic!("replay_prob 1 and filled: must replay"),
            }
        }
        for (k, pk) in keys.iter().zip(&p) {
            let f = *counts.get(k).unwrap_or(&0) as f64 / n as f64;
            let sd = (pk * (1.0 - pk) / n as f64).sqrt();
            assert!((f - pk).abs() < 5.0 * sd + 1e-9, "{k}: {f} vs {pk}");
        }
    }

    #[test]
    fn replay_probability_and_min_fill() {
        let mut b: LevelBuffer<u32> = LevelBuffer::new(LevelBufferConfig {
            capacity: 10,
            temperature: 1.0,
            staleness_coef: 0.0,
            replay_prob: 0.3,
            min_fill: 2,
        })
        .unwrap();
        let mut rng = seeded(2);
        b.update(1, 1.0).unwrap();
        for _ in 0..100 {
            assert_eq!(b.decide(&mut rng), Decision::New, "below min_fill");
        }
        b.update(2, 1.0).unwrap();
        let n = 20_000;
        let replays = (0..n)
            .filter(|_| matches!(b.decide(&mut rng), Decision::Replay(_)))
            .count();
        let f = replays as f64 / n as f64;
        // sd = sqrt(0.21 / 20000) = 0.0032
        assert!((f - 0.3).abs() < 0.016, "{f}");
    }

    #[test]
    fn capacity_eviction_replaces_lowest_only_if_better() {
        let mut b = buf(2, 0.0, 1);
        assert_eq!(b.update("a", 1.0).unwrap(), UpdateOutcome::Inserted);
        assert_eq!(b.update("b", 3.0).unwrap(), UpdateOutcome::Inserted);
        assert_eq!(b.update("c", 0.5).unwrap(), UpdateOutcome::Rejected);
        assert_eq!(b.update("d", 2.0).unwrap(), UpdateOutcome::Replaced("a"));
        assert_eq!(b.len(), 2);
        assert_eq!(b.score(&"a"), None);
        assert_eq!(b.update("b", 0.1).unwrap(), UpdateOutcome::Rescored);
        assert_eq!(b.update("e", 0.2).unwrap(), UpdateOutcome::Replaced("b"));
        let mut keys = b.keys();
        keys.sort();
        assert_eq!(keys, vec!["d", "e"]);
        b.record_return(&"d", 3.0).unwrap();
        b.record_return(&"d", 1.0).unwrap();
        assert_eq!(b.max_return(&"d"), Some(3.0));
        assert!(b
            .update("x", f64::NAN)
            .unwrap_err()
            .to_string()
            .contains("`score`"));
    }
}
