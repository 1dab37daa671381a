//! The actors crate's tests: the schedules on threads with fake roles, and the same runs
//! through the actor runtime, supervision included.

// Test helpers outside `#[test]` functions may unwrap too: a failure is a test failure.
#![allow(clippy::unwrap_used)]

mod checkpoints;
mod curricula;
mod pace;
mod runtime;
mod schedules;
