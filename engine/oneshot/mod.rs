//! The one-shot's client side, compiled into both binaries (not the library): `engine`, the
//! front users run (`front.rs`), and `engine-core`, the engine program (`main.rs`).
//!
//! `engine sandbox exec` served by a daemon (`engine sandbox daemon`) is a short process:
//! parse, ask the daemon, print the answer. Its start was most of it: the engine program is a
//! 146 MB executable whose dynamic loader applies 29k relocations (about 120 pages copied on
//! write) before `main`, about half of the client's time. The front is a small program that does the served one-shot itself
//! and hands every other command line, unchanged, to the engine program beside it (`execve`:
//! the same process, arguments and environment). What both must agree on lives here: the
//! command line ([`args`]), the wire ([`protocol`]), the asking ([`client`]) and the report
//! ([`outcome`]).

pub mod args;
pub mod client;
pub mod outcome;
pub mod protocol;

/// The engine program's file name, beside the front.
pub const CORE: &str = "engine-core";

/// The build of this code: a digest of what the front and the engine program must agree on
/// (`build.rs`). The engine program refuses a command line handed over by a front of another
/// build, and a daemon serves no client of another build.
pub const BUILD: &str = env!("ENVFACTORY_BUILD");

/// The variable by which the front tells the engine program its build (removed at its start).
pub const FRONT_BUILD_ENV: &str = "ENVFACTORY_FRONT_BUILD";
