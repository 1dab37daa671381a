//! A pool of warm sandboxes. A lease is reset when returned; a lease dropped without being
//! returned is reset too, or destroyed and replaced if it cannot be reset: never leaked.

use crate::backend::{Backend, SandboxOps};
use crate::lock;
use crate::{SandboxConfig, SandboxError};
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex};

struct Shared<B: Backend> {
    backend: B,
    cfg: SandboxConfig,
    idle: Mutex<Vec<B::Sandbox>>,
    ready: Condvar,
}

/// N warm sandboxes of one configuration.
pub struct Pool<B: Backend> {
    shared: Arc<Shared<B>>,
    size: usize,
}

impl<B: Backend> Pool<B> {
    /// Create `size` sandboxes up front.
    pub fn new(backend: B, cfg: SandboxConfig, size: usize) -> Result<Self, SandboxError> {
        let mut idle = Vec::with_capacity(size);
        for _ in 0..size {
            idle.push(backend.create(&cfg)?);
        }
        Ok(Self {
            shared: Arc::new(Shared {
                backend,
                cfg,
                idle: Mutex::new(idle),
                ready: Condvar::new(),
            }),
            size,
        })
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Sandboxes waiting to be leased.
    pub fn idle(&self) -> usize {
        lock(&self.shared.idle).len()
    }

    /// Take a sandbox, waiting for one to be returned if all are leased.
    pub fn lease(&self) -> Lease<B> {
        let mut idle = lock(&self.shared.idle);
        loop {
            if let Some(sb) = idle.pop() {
                return Lease {
                    shared: self.shared.clone(),
                    sandbox: Some(sb),
                };
            }
            idle = self
                .shared
                .ready
                .wait(idle)
                .unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// A leased sandbox; dereferences to the sandbox.
pub struct Lease<B: Backend> {
    shared: Arc<Shared<B>>,
    sandbox: Option<B::Sandbox>,
}

impl<B: Backend> Lease<B> {
    /// Reset the sandbox and return it to the pool.
    pub fn release(mut self) -> Result<(), SandboxError> {
        self.give_back()
    }

    fn give_back(&mut self) -> Result<(), SandboxError> {
        let Some(mut sb) = self.sandbox.take() else {
            return Ok(());
        };
        let result = if sb.is_alive() {
            sb.reset()
        } else {
            Err(SandboxError::Dead)
        };
        let sb = match result {
            Ok(()) => sb,
            Err(e) => {
                tracing::warn!(error = %e, "sandbox could not be reset; replacing it");
                drop(sb);
                let fresh = self.shared.backend.create(&self.shared.cfg)?;
                let mut idle = lock(&self.shared.idle);
                idle.push(fresh);
                self.shared.ready.notify_one();
                return Err(e);
            }
        };
        lock(&self.shared.idle).push(sb);
        self.shared.ready.notify_one();
        Ok(())
    }
}

impl<B: Backend> Deref for Lease<B> {
    type Target = B::Sandbox;
    fn deref(&self) -> &B::Sandbox {
        // Invariant: `sandbox` is Some until release/drop, which consume the lease.
        self.sandbox.as_ref().expect("lease used after release")
    }
}

impl<B: Backend> DerefMut for Lease<B> {
    fn deref_mut(&mut self) -> &mut B::Sandbox {
        // Invariant: as in `deref`.
        self.sandbox.as_mut().expect("lease used after release")
    }
}

impl<B: Backend> Drop for Lease<B> {
    fn drop(&mut self) {
        if let Err(e) = self.give_back() {
            tracing::warn!(error = %e, "lease dropped without release could not be recycled");
        }
    }
}
