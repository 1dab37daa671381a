//! The `engine` package: the environment factory domain, experiments and benchmarks. The
//! command line is in `main.rs`.

pub mod bench;
pub mod bench_env;
pub mod certify;
pub mod env;
pub mod experiment;
pub mod fingerprint;
pub mod fuzz;
pub mod live;
pub mod perturb;
pub mod probe;
pub mod synth;
pub mod tasks;
pub mod template;
pub mod units;
