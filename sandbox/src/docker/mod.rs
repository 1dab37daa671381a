//! Docker, through bollard: `docker:IMAGE` root filesystems for the native backend, and a
//! Docker backend behind [`crate::Backend`] (`docs/docker.md`).
//!
//! The steps, a file each: `client.rs` connects to the daemon (`DOCKER_HOST`, else the
//! default socket) and runs bollard's futures on a private runtime; `image.rs` exports an image
//! into the layer store through the OCI importer, cached by image id; `backend.rs` creates
//! containers with the sandbox's limits mapped to Docker's; `container.rs` is one live
//! container behind [`crate::SandboxOps`] (reset = recreate, snapshot = commit); `exec.rs`
//! runs a command (stdin, timeout, output caps); `layered.rs` stacks layer directories (a
//! synthesized instance) on an image as a new image; `host.rs` reads and signals the container's
//! processes through the kernel of this host (the daemon must be local).
//!
//! bollard appears nowhere else in the workspace.

mod error;

pub use error::DockerError;

#[cfg(feature = "docker")]
mod backend;
#[cfg(feature = "docker")]
mod client;
#[cfg(feature = "docker")]
mod container;
#[cfg(feature = "docker")]
mod exec;
#[cfg(feature = "docker")]
mod host;
#[cfg(feature = "docker")]
mod image;
#[cfg(feature = "docker")]
mod layered;

#[cfg(feature = "docker")]
pub use backend::DockerBackend;
#[cfg(feature = "docker")]
pub use client::Client;
#[cfg(feature = "docker")]
pub use container::DockerSandbox;
#[cfg(feature = "docker")]
pub use image::{import_image, ImageLayers};
