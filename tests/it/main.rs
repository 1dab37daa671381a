//! The engine's integration tests: one binary (each test file links the whole engine and
//! candle, so one binary is built once), a module per subsystem, fixtures in `common`.
//! Root-only tests skip with a message when not root.
#![allow(clippy::unwrap_used)]

#[macro_use]
extern crate sandbox;

mod common;

mod catalogue;
mod cli;
mod daemon;
mod debootstrap;
mod docker;
mod env;
mod experiment;
mod exploit;
mod fingerprint;
mod fuzz;
mod harbor;
mod layout;
mod learn;
mod llm;
mod netfuzz;
mod observe;
mod oneshot_init;
mod perturb;
mod selfplay;
mod serve;
mod signals;
mod synth;
mod tasks;
mod template;
mod tournament;
