//! The level space the adversaries, domain randomisation and ACCEL's mutations choose from:
//! one categorical dimension per fault family (choice 0 = off, the others pre-validated
//! parameter settings), a cost per choice, a strength budget, and masks for choices that do
//! not apply to the task or that the catalogue cannot recover from. Pure data: the `engine`
//! fills it from a template.

use crate::msg::Level;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Errors of a level space.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SpaceError {
    #[error("dimension `{dim}`: {reason}")]
    Dimension { dim: String, reason: String },
    #[error("budget {budget} is not a finite number >= 0")]
    Budget { budget: f64 },
    #[error("no fault fits the budget {budget}: the cheapest allowed choice costs {cheapest}")]
    NothingFits { budget: f64, cheapest: f64 },
    #[error("the task seed range is empty")]
    NoSeeds,
    #[error("level {level} has {got} choices; the space has {want} dimensions")]
    Shape {
        level: String,
        got: usize,
        want: usize,
    },
}

/// One fault family: its choices (index 0 = off) with their costs and whether each is allowed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Dimension {
    /// The fault family (a perturbation name).
    pub name: String,
    /// Printable name of each choice (`off` first).
    pub labels: Vec<String>,
    /// Cost of each choice (`cost[0]` is 0).
    pub cost: Vec<f64>,
    /// Whether each choice may be chosen (`allowed[0]`, off, always is).
    pub allowed: Vec<bool>,
}

impl Dimension {
    pub fn choices(&self) -> usize {
        self.labels.len()
    }
}

/// The space: dimensions, budget, and the task seeds levels are drawn with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelSpace {
    pub dims: Vec<Dimension>,
    /// The most a level's choices may cost together.
    pub budget: f64,
    /// Task seeds `seed_base .. seed_base + seed_count`.
    pub seed_base: u64,
    pub seed_count: u64,
    /// At most this many faults on at once (no limit unless [`with_max_active`](Self::with_max_active)).
    #[serde(default = "no_limit")]
    pub max_active: usize,
}

/// The cost of the cheapest allowed setting of `dims` (infinity when none is allowed).
pub fn cheapest(dims: &[Dimension]) -> f64 {
    dims.iter()
        .flat_map(|d| {
            d.cost
                .iter()
                .zip(&d.allowed)
                .skip(1)
                .filter(|(_, &a)| a)
                .map(|(&c, _)| c)
        })
        .fold(f64::INFINITY, f64::min)
}

fn no_limit() -> usize {
    usize::MAX
}

impl LevelSpace {
    /// A checked space.
    pub fn new(
        dims: Vec<Dimension>,
        budget: f64,
        seed_base: u64,
        seed_count: u64,
    ) -> Result<Self, SpaceError> {
        if !(budget.is_finite() && budget >= 0.0) {
            return Err(SpaceError::Budget { budget });
        }
        if seed_count == 0 {
            return Err(SpaceError::NoSeeds);
        }
        for d in &dims {
            let bad = |reason: String| SpaceError::Dimension {
                dim: d.name.clone(),
                reason,
            };
            if d.labels.len() < 2 {
                return Err(bad("needs `off` and at least one setting".into()));
            }
            if d.cost.len() != d.labels.len() || d.allowed.len() != d.labels.len() {
                return Err(bad(format!(
                    "{} labels, {} costs, {} allowed flags",
                    d.labels.len(),
                    d.cost.len(),
                    d.allowed.len()
                )));
            }
            if d.cost[0] != 0.0 || !d.allowed[0] {
                return Err(bad("choice 0 (off) must cost 0 and be allowed".into()));
            }
            if let Some(c) = d
                .cost
                .iter()
                .find(|c| !(c.is_finite() && **c > 0.0) && **c != 0.0)
            {
                return Err(bad(format!("cost {c} is not a finite number > 0")));
            }
            if d.cost.iter().skip(1).any(|&c| c <= 0.0) {
                return Err(bad("a setting's cost must be > 0".into()));
            }
        }
        let cheapest = cheapest(&dims);
        if cheapest.is_finite() && cheapest > budget {
            return Err(SpaceError::NothingFits { budget, cheapest });
        }
        Ok(Self {
            dims,
            budget,
            seed_base,
            seed_count,
            max_active: usize::MAX,
        })
    }

    /// The same space with at most `n` faults on at once (at least 1).
    pub fn with_max_active(mut self, n: usize) -> Self {
        self.max_active = n.max(1);
        self
    }

    /// Choices per dimension (the adversary's action space).
    pub fn choices(&self) -> Vec<usize> {
        self.dims.iter().map(Dimension::choices).collect()
    }

    /// The allowed-choice mask, flattened dimension by dimension.
    pub fn mask(&self) -> Vec<f32> {
        self.dims
            .iter()
            .flat_map(|d| d.allowed.iter().map(|&a| if a { 1.0 } else { 0.0 }))
            .collect()
    }

    /// What a level's choices cost (an out-of-range choice costs infinity).
    pub fn cost(&self, level: &Level) -> f64 {
        level
            .choices
            .iter()
            .zip(&self.dims)
            .map(|(&c, d)| d.cost.get(c as usize).copied().unwrap_or(f64::INFINITY))
            .sum()
    }

    /// The level is in the space: right shape, allowed choices, within the budget.
    pub fn check(&self, level: &Level) -> Result<(), SpaceError> {
        if !level.choices.is_empty() && level.choices.len() != self.dims.len() {
            return Err(SpaceError::Shape {
                level: level.key(),
                got: level.choices.len(),
                want: self.dims.len(),
            });
        }
        for (&c, d) in level.choices.iter().zip(&self.dims) {
            if !d.allowed.get(c as usize).copied().unwrap_or(false) {
                return Err(SpaceError::Dimension {
                    dim: d.name.clone(),
                    reason: format!("choice {c} of level {} is not allowed", level.key()),
                });
            }
        }
        if level.active() > self.max_active {
            return Err(SpaceError::Dimension {
                dim: "max_active".into(),
                reason: format!(
                    "level {} has {} faults on; at most {}",
                    level.key(),
                    level.active(),
                    self.max_active
                ),
            });
        }
        let cost = self.cost(level);
        if cost > self.budget + 1e-9 {
            return Err(SpaceError::Dimension {
                dim: "budget".into(),
                reason: format!("level {} costs {cost} > {}", level.key(), self.budget),
            });
        }
        Ok(())
    }

    /// A task seed drawn uniformly from the range.
    pub fn seed<R: Rng>(&self, rng: &mut R) -> u64 {
        self.seed_base + rng.gen_range(0..self.seed_count)
    }

    /// The clean level of a random task seed.
    pub fn clean<R: Rng>(&self, rng: &mut R) -> Level {
        Level {
            seed: self.seed(rng),
            choices: vec![0; self.dims.len()],
        }
    }

    /// Domain randomisation: dimensions visited in random order, each given a uniformly
    /// chosen allowed choice (off included) among those that still fit the budget.
    pub fn random<R: Rng>(&self, rng: &mut R) -> Level {
        let seed = self.seed(rng);
        let mut choices = vec![0u32; self.dims.len()];
        let mut order: Vec<usize> = (0..self.dims.len()).collect();
        order.shuffle(rng);
        let mut left = self.budget;
        let mut on = 0;
        for d in order {
            let dim = &self.dims[d];
            let fits: Vec<usize> = (0..dim.choices())
                .filter(|&c| {
                    dim.allowed[c] && dim.cost[c] <= left + 1e-9 && (c == 0 || on < self.max_active)
                })
                .collect();
            let c = fits.choose(rng).copied().unwrap_or(0);
            left -= dim.cost[c];
            on += usize::from(c != 0);
            choices[d] = c as u32;
        }
        Level { seed, choices }
    }

    /// ACCEL's edit: one or two dimensions of `level` set to another allowed choice that keeps
    /// it within the budget (the task seed is kept).
    pub fn mutate<R: Rng>(&self, level: &Level, rng: &mut R) -> Level {
        let mut out = level.clone();
        if out.choices.len() != self.dims.len() {
            out.choices = vec![0; self.dims.len()];
        }
        let edits = rng.gen_range(1..=2usize).min(self.dims.len());
        let mut order: Vec<usize> = (0..self.dims.len()).collect();
        order.shuffle(rng);
        let mut done = 0;
        // Dimensions in random order until `edits` of them could be changed within the
        // budget (switching a fault off always can).
        for &d in &order {
            if done == edits {
                break;
            }
            let dim = &self.dims[d];
            let current = out.choices[d] as usize;
            let rest = self.cost(&out) - dim.cost.get(current).copied().unwrap_or(0.0);
            // Switching a fault on needs room under the count cap as well as the budget.
            let room = current != 0 || out.active() < self.max_active;
            let options: Vec<usize> = (0..dim.choices())
                .filter(|&c| {
                    c != current
                        && dim.allowed[c]
                        && rest + dim.cost[c] <= self.budget + 1e-9
                        && (c == 0 || room)
                })
                .collect();
            if let Some(&c) = options.choose(rng) {
                out.choices[d] = c as u32;
                done += 1;
            }
        }
        out
    }

    /// The label of a level's faults (`clean` when none is on).
    pub fn describe(&self, level: &Level) -> String {
        let on: Vec<String> = level
            .choices
            .iter()
            .zip(&self.dims)
            .filter(|(&c, _)| c != 0)
            .map(|(&c, d)| {
                format!(
                    "{}({})",
                    d.name,
                    d.labels.get(c as usize).map_or("?", String::as_str)
                )
            })
            .collect();
        if on.is_empty() {
            "clean".into()
        } else {
            on.join("+")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn space(budget: f64) -> LevelSpace {
        let dim = |name: &str, n: usize, cost: f64| Dimension {
            name: name.into(),
            labels: (0..n)
                .map(|i| {
                    if i == 0 {
                        "off".into()
                    } else {
                        format!("v{i}")
                    }
                })
                .collect(),
            cost: (0..n).map(|i| if i == 0 { 0.0 } else { cost }).collect(),
            allowed: (0..n).map(|i| i != 2).collect(),
        };
        LevelSpace::new(
            vec![dim("a", 3, 1.0), dim("b", 4, 2.0), dim("c", 2, 1.5)],
            budget,
            100,
            10,
        )
        .unwrap()
    }

    #[test]
    fn random_and_mutated_levels_stay_in_the_space() {
        let s = space(2.5);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (mut seen_on, mut changed) = (0, 0);
        for _ in 0..500 {
            let l = s.random(&mut rng);
            s.check(&l).unwrap();
            assert!((100..110).contains(&l.seed));
            seen_on += l.active();
            let m = s.mutate(&l, &mut rng);
            s.check(&m).unwrap();
            assert_eq!(m.seed, l.seed);
            changed += usize::from(m != l);
        }
        assert_eq!(changed, 500, "a mutation left its level unchanged");
        assert!(
            seen_on > 100,
            "domain randomisation switched {seen_on} faults on in 500 levels"
        );
    }

    #[test]
    fn the_fault_count_cap_holds_for_draws_mutations_and_checks() {
        let s = space(10.0).with_max_active(1);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for _ in 0..300 {
            let l = s.random(&mut rng);
            assert!(l.active() <= 1, "{l:?}");
            let m = s.mutate(&l, &mut rng);
            assert!(m.active() <= 1, "{m:?}");
        }
        let two = Level {
            seed: 100,
            choices: vec![1, 1, 0],
        };
        assert!(s.check(&two).is_err(), "two faults passed a cap of one");
        assert!(space(10.0).check(&two).is_ok());
    }

    #[test]
    fn bad_spaces_are_refused_with_the_reason() {
        let mut s = space(2.5);
        assert!(matches!(
            LevelSpace::new(s.dims.clone(), f64::NAN, 0, 1),
            Err(SpaceError::Budget { .. })
        ));
        assert!(matches!(
            LevelSpace::new(s.dims.clone(), 0.5, 0, 1),
            Err(SpaceError::NothingFits { .. })
        ));
        assert!(matches!(
            LevelSpace::new(s.dims.clone(), 3.0, 0, 0),
            Err(SpaceError::NoSeeds)
        ));
        s.dims[0].cost[1] = f64::INFINITY;
        let e = LevelSpace::new(s.dims.clone(), 3.0, 0, 1).unwrap_err();
        assert!(e.to_string().contains("dimension `a`"), "{e}");
        let s = space(2.5);
        let over = Level {
            seed: 1,
            choices: vec![1, 1, 1],
        };
        assert!(s.check(&over).is_err(), "a level over the budget passed");
        let masked = Level {
            seed: 1,
            choices: vec![2, 0, 0],
        };
        assert!(s.check(&masked).is_err(), "a masked choice passed");
    }
}
