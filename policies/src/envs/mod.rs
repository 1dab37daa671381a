//! Environments used by the examples, tests and benchmarks.
//!
//! * [`cartpole`]: an exact port of Gymnasium's `CartPole-v1` (with its 500-step limit).
//! * [`toy`]: a contextual bandit, a chain with a delayed reward and a masked
//!   multi-discrete task, each small enough to learn in seconds.

pub mod cartpole;
pub mod toy;
