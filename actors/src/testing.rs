//! Tiny fake roles for the schedules' and the runtime's tests (and for anyone writing a
//! new schedule): a fault-matching environment, a tabular agent that learns, a bandit
//! adversary, a critic that finds faults implausible and a score-ordered level buffer.
//! Everything is seeded, so a run is reproducible on threads and through actors alike.

use crate::msg::{
    Acted, EpisodeOutcome, Failure, FailureKind, LearnStats, Level, Pick, Proposal, Recorded,
    Start, StepResult, Transition,
};
use crate::roles::{Agent, Critic, Curriculum, EnvWorker, RoleError, Synthesizer};
use crate::space::{Dimension, LevelSpace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A space of `dims` fault dimensions with `choices` settings each (plus off), cost 1 per
/// fault, budget `budget`, task seeds `0..seeds`.
pub fn space(dims: usize, choices: usize, budget: f64, seeds: u64) -> LevelSpace {
    let dims = (0..dims)
        .map(|d| Dimension {
            name: format!("fault{d}"),
            labels: (0..=choices)
                .map(|c| {
                    if c == 0 {
                        "off".into()
                    } else {
                        format!("v{c}")
                    }
                })
                .collect(),
            cost: (0..=choices)
                .map(|c| if c == 0 { 0.0 } else { 1.0 })
                .collect(),
            allowed: vec![true; choices + 1],
        })
        .collect();
    LevelSpace::new(dims, budget, 0, seeds).expect("a valid fake space")
}

/// Faults the fake environment injects into its own runs.
#[derive(Debug, Clone, Default)]
pub struct Sabotage {
    /// Panic at this (global, over all workers) step number.
    pub panic_at_step: Option<u64>,
    /// Levels of these task seeds fail their steps as an infrastructure failure.
    pub infra_seeds: Vec<u64>,
    /// Levels of these task seeds cannot be played (their reset answers `Unusable`).
    pub unusable_seeds: Vec<u64>,
}

/// The fake environment: a level's right action is `1 + d` for its first fault dimension
/// `d` that is on (0 when clean); the right action ends the episode with reward 1, a wrong
/// one costs 0.1, and the episode is truncated after `max_steps`. The observation is the
/// one-hot of the faults that are on, then the step count.
pub struct FakeWorker {
    dims: usize,
    max_steps: u32,
    level: Option<Level>,
    t: u32,
    sabotage: Sabotage,
    /// Steps over every worker sharing it.
    steps: Arc<AtomicU64>,
}

impl FakeWorker {
    pub fn new(dims: usize, max_steps: u32, sabotage: Sabotage, steps: Arc<AtomicU64>) -> Self {
        Self {
            dims,
            max_steps,
            level: None,
            t: 0,
            sabotage,
            steps,
        }
    }

    /// Actions of the fake environment (`dims + 1`).
    pub fn actions(dims: usize) -> usize {
        dims + 1
    }

    fn obs(&self) -> Vec<f32> {
        let mut o = vec![0.0; self.dims + 1];
        if let Some(l) = &self.level {
            for (d, &c) in l.choices.iter().enumerate().take(self.dims) {
                if c != 0 {
                    o[d] = 1.0;
                }
            }
        }
        o[self.dims] = self.t as f32;
        o
    }

    fn right(&self) -> u32 {
        self.level
            .as_ref()
            .and_then(|l| l.choices.iter().position(|&c| c != 0))
            .map_or(0, |d| d as u32 + 1)
    }
}

impl EnvWorker for FakeWorker {
    fn reset(&mut self, level: &Level) -> Result<Start, Failure> {
        if self.sabotage.unusable_seeds.contains(&level.seed) {
            return Err(Failure::new(
                FailureKind::Unusable,
                format!("level {} is unusable", level.key()),
            ));
        }
        self.level = Some(level.clone());
        self.t = 0;
        Ok(Start {
            obs: self.obs(),
            mask: vec![1.0; Self::actions(self.dims)],
        })
    }

    fn step(&mut self, action: u32) -> StepResult {
        let n = self.steps.fetch_add(1, Ordering::SeqCst) + 1;
        if self.sabotage.panic_at_step == Some(n) {
            panic!("the fake worker was told to panic at step {n}");
        }
        let Some(level) = &self.level else {
            return Err(Failure::new(
                FailureKind::Infrastructure,
                "step before reset",
            ));
        };
        if self.sabotage.infra_seeds.contains(&level.seed) {
            return Err(Failure::new(
                FailureKind::Infrastructure,
                "the fake sandbox died",
            ));
        }
        self.t += 1;
        let success = action == self.right();
        Ok(Transition {
            obs: self.obs(),
            mask: vec![1.0; Self::actions(self.dims)],
            reward: if success { 1.0 } else { -0.1 },
            terminated: success,
            truncated: !success && self.t >= self.max_steps,
            success,
            progress: if success { 1.0 } else { 0.0 },
        })
    }
}

/// What the fake agent saw, shared with the test.
#[derive(Debug, Default, Clone)]
pub struct AgentLog {
    pub learned_samples: u64,
    /// Samples recorded as invalid (they must never be learned from).
    pub invalid_samples: u64,
    pub updates: u64,
}

/// A tabular agent: the mean reward of each action per observation, epsilon-greedy.
pub struct FakeAgent {
    rng: ChaCha8Rng,
    epsilon: f64,
    actions: usize,
    rollout: usize,
    q: HashMap<Vec<u8>, Vec<(f64, f64)>>,
    pending: Option<(Vec<Vec<u8>>, Vec<u32>)>,
    batch: Vec<(Vec<u8>, u32, f32, bool)>,
    pub log: Arc<Mutex<AgentLog>>,
}

fn key(obs: &[f32]) -> Vec<u8> {
    obs.iter().map(|&x| x as u8).collect()
}

impl FakeAgent {
    pub fn new(seed: u64, actions: usize, rollout: usize, epsilon: f64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            epsilon,
            actions,
            rollout,
            q: HashMap::new(),
            pending: None,
            batch: Vec::new(),
            log: Arc::default(),
        }
    }

    fn best(&self, k: &[u8]) -> (u32, f32) {
        match self.q.get(k) {
            None => (0, 0.0),
            Some(row) => {
                let (a, v) = row
                    .iter()
                    .enumerate()
                    .map(|(a, &(s, n))| (a, if n > 0.0 { s / n } else { 0.0 }))
                    .fold((0, f64::NEG_INFINITY), |b, x| if x.1 > b.1 { x } else { b });
                (a as u32, v as f32)
            }
        }
    }
}

impl Agent for FakeAgent {
    fn rollout_len(&self) -> usize {
        self.rollout
    }

    fn act(&mut self, obs: &[f32], _masks: &[f32], n: usize) -> Result<Acted, RoleError> {
        let dim = obs.len() / n.max(1);
        let mut keys = Vec::with_capacity(n);
        let (mut actions, mut values) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for row in obs.chunks(dim.max(1)).take(n) {
            let k = key(&row[..row.len().saturating_sub(1)]);
            let (a, v) = self.best(&k);
            let a = if self.rng.gen::<f64>() < self.epsilon {
                self.rng.gen_range(0..self.actions as u32)
            } else {
                a
            };
            keys.push(k);
            actions.push(a);
            values.push(v);
        }
        self.pending = Some((keys, actions.clone()));
        Ok(Acted { actions, values })
    }

    fn record(&mut self, step: &Recorded) -> Result<(), RoleError> {
        let (keys, actions) = self
            .pending
            .take()
            .ok_or_else(|| RoleError::new("fake agent", "record without act"))?;
        for (i, (k, a)) in keys.into_iter().zip(actions).enumerate() {
            self.batch.push((k, a, step.rewards[i], step.valid[i]));
        }
        Ok(())
    }

    fn learn(&mut self, _next: &[f32], _n: usize) -> Result<LearnStats, RoleError> {
        let mut log = self
            .log
            .lock()
            .map_err(|_| RoleError::new("fake agent", "log poisoned"))?;
        let actions = self.actions;
        for (k, a, r, valid) in self.batch.drain(..) {
            if !valid {
                log.invalid_samples += 1;
                continue;
            }
            let row = self.q.entry(k).or_insert_with(|| vec![(0.0, 0.0); actions]);
            row[a as usize].0 += f64::from(r);
            row[a as usize].1 += 1.0;
            log.learned_samples += 1;
        }
        log.updates += 1;
        Ok(LearnStats {
            values: vec![("samples".into(), log.learned_samples as f64)],
        })
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        std::fs::write(
            dir.join("fake-agent.txt"),
            format!("{} states\n", self.q.len()),
        )
        .map_err(|e| RoleError::wrap("fake agent", e))
    }
}

/// A bandit adversary: a weight per fault dimension; proposals switch on one dimension
/// drawn by softmax of the weights (within the space), learning moves the weights toward
/// the rewards.
pub struct FakeSynthesizer {
    space: LevelSpace,
    rng: ChaCha8Rng,
    pub weights: Vec<f64>,
    token: u64,
    pub observed: u64,
    /// The budget of every `propose` call.
    pub budgets: Arc<Mutex<Vec<f64>>>,
    /// Every `(proposal, reward)` it learned from, shared with the test.
    pub learned: Arc<Mutex<Vec<(Proposal, f64)>>>,
}

impl FakeSynthesizer {
    pub fn new(space: LevelSpace, seed: u64) -> Self {
        let n = space.dims.len();
        Self {
            space,
            rng: ChaCha8Rng::seed_from_u64(seed),
            weights: vec![0.0; n],
            token: 0,
            observed: 0,
            budgets: Arc::default(),
            learned: Arc::default(),
        }
    }
}

impl Synthesizer for FakeSynthesizer {
    fn propose(&mut self, n: usize, budget: f64) -> Result<Vec<Proposal>, RoleError> {
        if let Ok(mut b) = self.budgets.lock() {
            b.push(budget);
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let z: f64 = self.weights.iter().map(|w| w.exp()).sum();
            let mut u = self.rng.gen::<f64>() * z;
            let mut d = self.weights.len() - 1;
            for (i, w) in self.weights.iter().enumerate() {
                u -= w.exp();
                if u <= 0.0 {
                    d = i;
                    break;
                }
            }
            let mut level = self.space.clean(&mut self.rng);
            // The fault goes on only when it fits the budget asked for.
            if self.space.dims[d].cost[1] <= budget + 1e-9 {
                level.choices[d] = 1;
            }
            self.token += 1;
            out.push(Proposal {
                level,
                token: self.token,
            });
        }
        Ok(out)
    }

    fn observe(&mut self, outcomes: &[EpisodeOutcome]) -> Result<(), RoleError> {
        self.observed += outcomes.len() as u64;
        Ok(())
    }

    fn learn(&mut self, scored: &[(Proposal, f64)]) -> Result<LearnStats, RoleError> {
        self.learned
            .lock()
            .map_err(|_| RoleError::new("fake adversary", "log poisoned"))?
            .extend_from_slice(scored);
        let mean = scored.iter().map(|(_, r)| r).sum::<f64>() / scored.len().max(1) as f64;
        for (p, r) in scored {
            if let Some(d) = p.level.choices.iter().position(|&c| c != 0) {
                self.weights[d] += 0.5 * (r - mean);
            }
        }
        Ok(LearnStats {
            values: vec![("mean_reward".into(), mean)],
        })
    }

    fn save(&self, dir: &Path) -> Result<(), RoleError> {
        std::fs::write(dir.join("weights.txt"), format!("{:?}\n", self.weights))
            .map_err(|e| RoleError::wrap("fake adversary", e))
    }
}

/// A critic for which every fault is one unit less plausible: `log D = -active`.
#[derive(Default)]
pub struct FakeCritic {
    pub learned: u64,
}

impl Critic for FakeCritic {
    fn realism(&mut self, levels: &[Level]) -> Result<Vec<f64>, RoleError> {
        Ok(levels.iter().map(|l| -(l.active() as f64)).collect())
    }

    fn learn(&mut self, generated: &[Level]) -> Result<LearnStats, RoleError> {
        self.learned += generated.len() as u64;
        Ok(LearnStats {
            values: vec![("auc".into(), 0.5)],
        })
    }

    fn save(&self, _dir: &Path) -> Result<(), RoleError> {
        Ok(())
    }
}

/// A level buffer: replays with probability `replay_prob` the level of highest score (ties
/// to the oldest); a level's score is the positive part of its return's excess over the
/// agent's value estimates (a positive-value-loss flavour); at most `capacity` levels, the
/// lowest-scored evicted.
pub struct FakeCurriculum {
    rng: ChaCha8Rng,
    replay_prob: f64,
    capacity: usize,
    pub levels: Vec<(Level, f64)>,
    pub updates: u64,
}

impl FakeCurriculum {
    pub fn new(seed: u64, replay_prob: f64, capacity: usize) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            replay_prob,
            capacity,
            levels: Vec::new(),
            updates: 0,
        }
    }
}

impl Curriculum for FakeCurriculum {
    fn pick(&mut self) -> Result<Pick, RoleError> {
        if !self.levels.is_empty() && self.rng.gen::<f64>() < self.replay_prob {
            let best = self
                .levels
                .iter()
                .fold(&self.levels[0], |b, x| if x.1 > b.1 { x } else { b });
            return Ok(Pick::Replay(best.0.clone()));
        }
        Ok(Pick::Fresh)
    }

    fn update(&mut self, o: &EpisodeOutcome) -> Result<(), RoleError> {
        if !o.counted() {
            return Err(RoleError::new(
                "fake curriculum",
                "a failed episode was scored",
            ));
        }
        self.updates += 1;
        let v = o.values.iter().map(|&v| f64::from(v)).sum::<f64>() / o.values.len().max(1) as f64;
        let score = (o.ret - v).max(0.0) + if o.success { 0.0 } else { 1.0 };
        match self.levels.iter_mut().find(|(l, _)| *l == o.level) {
            Some(e) => e.1 = score,
            None => {
                self.levels.push((o.level.clone(), score));
                if self.levels.len() > self.capacity {
                    let worst = self.levels.iter().enumerate().fold(0, |w, (i, x)| {
                        if x.1 < self.levels[w].1 {
                            i
                        } else {
                            w
                        }
                    });
                    self.levels.remove(worst);
                }
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.levels.len()
    }

    fn save(&self, _dir: &Path) -> Result<(), RoleError> {
        Ok(())
    }
}
