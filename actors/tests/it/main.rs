//! The actors crate's tests: the schedules on threads with fake roles, and the same runs
//! through the actor runtime, supervision included.

mod runtime;
mod schedules;
