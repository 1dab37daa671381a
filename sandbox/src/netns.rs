//! Network namespaces made ahead of time. Creating one (`copy_net_ns`: every per-namespace
//! subsystem, the loopback device) is the largest single cost of a sandbox's namespaced clone,
//! about half a millisecond. A background thread of the runtime makes a few in advance, each
//! with `lo` up, and each new sandbox's init enters one with `setns` instead of cloning with
//! `CLONE_NEWNET`.
//!
//! A namespace is handed out once and only once: [`NetnsReserve::take`] moves its descriptor
//! out of the reserve, the clone child enters it, and the host closes its descriptor right
//! after the clone, so the sandbox's init holds the only reference and the namespace dies with
//! it. No sandbox can see another's sockets, listeners or settings. Nothing is bind-mounted
//! (no `/run/netns`): a namespace lives only while a descriptor or a process holds it, so a
//! crashed engine leaves none behind and `engine reap` has nothing to remove.
//!
//! The thread returns to the engine's own network namespace after each one it makes, so every
//! namespace is created from the same namespace a `CLONE_NEWNET` clone would start from (the
//! sysctls a new namespace inherits are the same).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};

/// Why a namespace could not be made ahead of time (the sandbox then clones a new one).
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        source: std::io::Error,
    },
}

fn os(what: &'static str) -> impl FnOnce(std::io::Error) -> NetnsError {
    move |source| NetnsError::Os { what, source }
}

/// How many namespaces the reserve keeps ready.
pub const DEFAULT_RESERVE: usize = 2;

#[derive(Default)]
struct State {
    ready: Vec<OwnedFd>,
    /// Set when the runtime goes: the thread stops and the ready ones are closed.
    stop: bool,
    started: bool,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when one is taken (the thread refills) and when the reserve stops.
    wake: Condvar,
    target: usize,
}

/// The runtime's reserve of ready network namespaces (see the module).
pub struct NetnsReserve {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl NetnsReserve {
    /// A reserve that keeps `target` namespaces ready once started (0: never makes any).
    pub fn new(target: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                target,
            }),
            thread: Mutex::new(None),
        }
    }

    /// Start the background thread, once. (The runtime starts it at its second sandbox, so
    /// a one-shot process that creates one sandbox makes no namespace it would not use.)
    pub fn start(&self) {
        if self.shared.target == 0 {
            return;
        }
        {
            let mut st = crate::lock(&self.shared.state);
            if st.started || st.stop {
                return;
            }
            st.started = true;
        }
        let shared = self.shared.clone();
        let spawned = std::thread::Builder::new()
            .name("netns-reserve".into())
            .spawn(move || fill(&shared));
        match spawned {
            Ok(h) => *crate::lock(&self.thread) = Some(h),
            Err(e) => tracing::debug!(error = %e, "network namespace reserve not started"),
        }
    }

    /// A ready namespace, never handed out before, or `None` if none is ready now.
    pub fn take(&self) -> Option<OwnedFd> {
        let fd = crate::lock(&self.shared.state).ready.pop();
        if fd.is_some() {
            self.shared.wake.notify_all();
        }
        fd
    }

    /// Namespaces ready now.
    pub fn ready(&self) -> usize {
        crate::lock(&self.shared.state).ready.len()
    }
}

impl Drop for NetnsReserve {
    fn drop(&mut self) {
        {
            let mut st = crate::lock(&self.shared.state);
            st.stop = true;
            st.ready.clear();
        }
        self.shared.wake.notify_all();
        if let Some(h) = crate::lock(&self.thread).take() {
            let _ = h.join();
        }
    }
}

/// The thread: keep `target` namespaces ready until stopped.
fn fill(shared: &Shared) {
    let home = match open_own_netns() {
        Ok(fd) => fd,
        Err(e) => {
            tracing::debug!(error = %e, "network namespace reserve: no handle on our own");
            return;
        }
    };
    loop {
        {
            let mut st = crate::lock(&shared.state);
            while !st.stop && st.ready.len() >= shared.target {
                st = shared.wake.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.stop {
                return;
            }
        }
        let t0 = std::time::Instant::now();
        match make_one(&home) {
            Ok(fd) => {
                let mut st = crate::lock(&shared.state);
                if st.stop {
                    return;
                }
                st.ready.push(fd);
                tracing::trace!(
                    us = t0.elapsed().as_micros() as u64,
                    ready = st.ready.len(),
                    "network namespace made ahead"
                );
            }
            Err(e) => {
                // Sandboxes clone their own from now on; nothing is weakened.
                tracing::debug!(error = %e, "network namespace reserve stopped");
                return;
            }
        }
    }
}

fn open_own_netns() -> Result<OwnedFd, NetnsError> {
    let f = std::fs::File::open("/proc/thread-self/ns/net")
        .map_err(os("opening our network namespace"))?;
    Ok(OwnedFd::from(f))
}

/// A new network namespace with `lo` up, made on this thread, which then goes back `home`.
fn make_one(home: &OwnedFd) -> Result<OwnedFd, NetnsError> {
    // SAFETY: unshare with a flag only; it moves this thread (not the process) into a new
    // network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(os("unshare(CLONE_NEWNET)")(std::io::Error::last_os_error()));
    }
    let made = open_own_netns().and_then(|fd| {
        loopback_up()
            .map_err(|e| os("bringing up lo")(std::io::Error::from(e)))
            .map(|()| fd)
    });
    // SAFETY: setns on a descriptor we own, back to the namespace this thread started in.
    if unsafe { libc::setns(home.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(os("returning to our network namespace")(
            std::io::Error::last_os_error(),
        ));
    }
    made
}

/// Enter the namespace of `fd` (in the clone child, before `execve`: only the syscall).
///
/// # Safety
/// `fd` must be an open network namespace descriptor. Async-signal-safe.
pub(crate) unsafe fn enter(fd: i32) -> i32 {
    // SAFETY: the caller passes an open descriptor; setns is a plain syscall.
    unsafe { libc::setns(fd, libc::CLONE_NEWNET) }
}

/// Bring up `lo` in the calling thread's network namespace (a sandbox's only interface).
pub(crate) fn loopback_up() -> Result<(), nix::errno::Errno> {
    use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};
    let s = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS as libc::Ioctl, &mut req) } < 0 {
        return Err(nix::errno::Errno::last());
    }
    // SAFETY: the flags member of the union was just filled by the kernel.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &req) } < 0 {
        return Err(nix::errno::Errno::last());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_of_zero_never_starts() {
        let r = NetnsReserve::new(0);
        r.start();
        assert!(r.take().is_none());
        assert_eq!(r.ready(), 0);
    }
}
