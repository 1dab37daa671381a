//! The `engine` package: the environment factory, experiments and benchmarks. The command
//! line is `main.rs` over `cli/`.
//!
//! Modules, bottom-up (each uses only modules above it in this list):
//!
//! | module | what it is |
//! |---|---|
//! | [`text`] | input files read bounded and located, long values cut, control characters escaped |
//! | [`units`] | durations and sizes as users write them (`10s`, `64M`), range-checked |
//! | [`work_queue`] | items shared out to worker threads that keep their own state (an `Env`), results in item order |
//! | [`instance`] | LEAF vocabulary: plans, parameters, resources, instance ids, the layer model and its builder, path helpers |
//! | [`netfault`] | the fault proxy runtime (threads in a sandbox's network namespace) |
//! | [`probe`] | trusted reads for verifiers: files and `/proc` through init, TCP via `setns` |
//! | [`perturb`] | the fault catalogue, a file per family, written through [`instance::Builder`] |
//! | [`tasks`] | task families: setup, verifier, oracle, catalogue, hack trials |
//! | [`synth`] | plan -> instance: the task's setup and the faults on a builder, the instance cache |
//! | [`running`] | an instance running in its sandbox: episode starts, fault proxies, probes |
//! | [`certify`] | solvability certificates, and the `engine task check` campaign |
//! | [`features`] | the feature vector of an observation: text blocks, numbers, action history |
//! | [`env`] | the RL environment: `Env::reset`, `Env::step`, rewards, observations |
//! | [`actions`] | action files: one action per line, errors located |
//! | [`agents`] | what chooses actions: random, oracle, catalogue oracle, scripts, trained policies |
//! | [`episode`] | the one episode loop: an agent in an `Env` |
//! | [`harbor`] | Harbor and Terminal-Bench task folders: the Dockerfile subset built into cached layers, episodes with the task's own tests, the factory's perturbations on top |
//! | [`learn`] | PPO in the factory's environments: the adapter, training runs, evaluation, plots |
//! | [`exploit`] | the reward exploit check: no constant or two-action cycle beats the catalogue oracle |
//! | [`fingerprint`] | feature vectors of systems (real or synthesized) for realism |
//! | [`template`] | templates: the positioned TOML/YAML tree, validation, sampling into plans |
//! | [`realism`] | the real set against generated instances: scaled features, the classifier's held-out AUC |
//! | [`roles`] | the self-play roles of `actors` over the factory: level space, Env worker, PPO, adversary, level buffer |
//! | [`experiment`] | `engine run`: config, runner, statistics, self-play; `engine tournament` (cross-play, Nash) and `engine sweep` (ablation grids) |
//! | [`bench`] | `engine bench sandbox` and `engine bench env` |
//! | [`serve`] | `engine serve`: the OpenEnv protocol over HTTP and WebSocket, many sessions, MCP |

pub mod actions;
pub mod agents;
pub mod bench;
pub mod certify;
pub mod env;
pub mod episode;
pub mod experiment;
pub mod exploit;
pub mod features;
pub mod fingerprint;
pub mod harbor;
pub mod instance;
pub mod learn;
pub mod looks;
pub mod netfault;
pub mod perturb;
pub mod probe;
pub mod realism;
pub mod roles;
pub mod running;
pub mod serve;
pub mod synth;
pub mod tasks;
pub mod template;
pub mod text;
pub mod units;
pub mod work_queue;
