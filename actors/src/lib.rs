//! `actors`: the self-play runtime on actix. The roles it runs (protagonist and antagonist
//! agents, adversary synthesizers, the realism critic, environment workers, the curriculum)
//! are traits with no actix in them (`roles`), the messages are plain serde types (`msg`),
//! and the schedules (clean, DR, RARL, PAIRED, robust PLR, ACCEL, SFL) are pure code over the
//! roles (`schedule`). `runtime` runs a schedule with every role in its own actor and the
//! workers in parallel, supervised. It is the only crate that knows actix; the `engine`
//! package implements the roles.
//!
//! | module | what it is |
//! |---|---|
//! | `msg` | levels, assignments, transitions, outcomes, failures, proposals |
//! | `roles` | [`roles::Agent`], [`roles::Synthesizer`], [`roles::Critic`], [`roles::EnvWorker`], [`roles::Curriculum`], [`roles::Workers`] |
//! | `space` | [`space::LevelSpace`]: fault dimensions, costs, budget, masks |
//! | `workers` | [`workers::ThreadWorkers`]: workers on scoped threads (the direct loop) |
//! | `schedule` | [`schedule::Schedule`] per method, [`schedule::Arena`] |
//! | `runtime` | the actors, the coordinator, supervision |
//! | `testing` | fake roles for tests |

pub mod msg;
pub mod roles;
pub mod runtime;
pub mod schedule;
pub mod space;
pub mod testing;
pub mod workers;
