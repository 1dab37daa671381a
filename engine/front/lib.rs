//! The parts of the engine's library that the `engine` front uses (`units`, `text`), compiled
//! from the same files: the static front's package (`Cargo.toml` here) builds `front.rs` and
//! `oneshot/` unchanged for musl, without the rest of the library (its learning, servers and
//! Docker client would have to build for musl too).

#[path = "../units.rs"]
pub mod units;

#[path = "../text.rs"]
pub mod text;
