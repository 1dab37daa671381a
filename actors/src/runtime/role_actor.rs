//! The actor every learning role lives in: one `SyncArbiter` thread holding the role. A
//! learner is not restarted (its state would be lost); after a panic the thread is gone and
//! every later request fails with the role's name.

use crate::roles::RoleError;
use std::sync::Mutex;

/// A role in its own thread.
pub struct RoleActor<R: ?Sized + Send + 'static> {
    pub(super) role: &'static str,
    pub(super) inner: Option<Box<R>>,
}

impl<R: ?Sized + Send + 'static> actix::Actor for RoleActor<R> {
    type Context = actix::SyncContext<Self>;
}

impl<R: ?Sized + Send + 'static> RoleActor<R> {
    /// Start `inner` in its actor.
    pub(super) fn start(role: &'static str, inner: Box<R>) -> actix::Addr<Self> {
        let slot = Mutex::new(Some(inner));
        actix::SyncArbiter::start(1, move || RoleActor {
            role,
            // Taken once, at the start; a restart (which nothing asks for) finds it empty.
            inner: slot.lock().ok().and_then(|mut s| s.take()),
        })
    }

    /// The role, or the error saying it was lost.
    pub(super) fn get(&mut self) -> Result<&mut R, RoleError> {
        let role = self.role;
        self.inner
            .as_deref_mut()
            .ok_or_else(|| RoleError::new(role, "its actor was restarted and lost its state"))
    }
}
