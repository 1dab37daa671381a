//! The sandbox crate's integration tests, one binary: one module per subject, fixtures from
//! `sandbox::testing` and `common`. Most tests need root (namespaces, mounts, cgroups) and skip
//! with a message without it; CI runs them as root.

// Test helpers outside `#[test]` fns: a panic is the intended failure mode.
#![allow(clippy::unwrap_used)]

mod common;

mod admission;
mod attacks;
mod basic;
mod direct;
mod docker;
mod init_reserve;
mod netns;
mod oci;
mod readonly;
mod rootfs;
mod state;
mod userns;
