//! `policies`: learning on candle, pure and testable without a sandbox.
//!
//! * [`encoder`]: text (+ numeric) observations to fixed-size feature vectors.
//! * [`nets`] and [`weight_init`]: MLPs and the actor-critic, orthogonally initialised (weight
//!   initialisation; not PID 1).
//! * [`dist`]: the masked multi-discrete (multi-categorical) action distribution.
//! * [`optim`]: Adam over candle `Var`s, global gradient-norm clipping, LR schedule.
//! * [`ppo`]: GAE, the PPO losses, the rollout buffer and the PPO agent.
//! * [`rollout`]: the minimal environment trait the crate trains against, a vectorised
//!   wrapper with auto-reset and the rollout collector.
//! * [`adversary`]: a policy over perturbation parameters with a strength cap.
//! * [`discriminator`]: the realism classifier (real vs synthesized fingerprints).
//! * [`curriculum`]: regret / learnability scorers and the prioritised level buffer.
//! * [`checkpoint`]: safetensors weights plus a msgpack state file.
//! * [`envs`]: Gymnasium's CartPole-v1 and small learning tasks used by tests and examples.
//!
//! The crate knows nothing of sandboxes or actors; see `docs/policies.md`.

pub mod adversary;
pub mod checkpoint;
pub mod curriculum;
pub mod discriminator;
pub mod dist;
pub mod encoder;
pub mod envs;
pub mod nets;
pub mod optim;
pub mod ppo;
pub mod rng;
pub mod rollout;
pub mod weight_init;
