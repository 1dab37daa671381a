//! The `engine` package: the environment factory domain, experiments and benchmarks. The
//! command line is in `main.rs`.

pub mod bench;
pub mod experiment;
pub mod units;
