//! `actors`: the self-play runtime (protagonist, adversary, discriminator, sandbox workers,
//! curriculum, coordinator) on actix. It is the only crate that knows actix; the roles it runs
//! are traits that the `engine` package implements.
//!
//! This crate is a placeholder in the workspace layout until its issue lands: it has no code
//! yet, so nothing depends on it.
