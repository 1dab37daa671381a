//! Inits started ahead of time. Cloning a sandbox's init into its new namespaces and letting
//! it `execve` and load is about a third of creating a sandbox, and none of it depends on the
//! sandbox's configuration: init starts, then waits on its control socket for its plan (the
//! first `Setup` request: cgroups to join, root, limits, policy). A background thread of the
//! runtime keeps a few inits started and waiting, and [`Runtime::create`] hands one its plan
//! instead of cloning a new one.
//!
//! Each spare is made as `Runtime::create` would make a sandbox's: its name (`s<N>` of the
//! runtime's counter), directory and cgroups (no limit written until the plan), its record
//! `<run>/sbx/<name>.init` for the reaper. The thread then sends it a `Prepare` and init does,
//! before its plan, what depends on nothing else: it joins the cgroups, brings `lo` up and
//! lays out its private directory and side trees (`init/mod.rs`, `prepare`). The plan must
//! name the same directory and cgroups.
//!
//! Given the plan the runtime expects ([`InitReserve::expect`]: its first, then one that two
//! creates in a row had), init also
//! mounts that root, starts its zygote and binds the side trees before it answers; the
//! sandbox's plan keeps them when it has the same root and confinement and the same layer
//! directories, else init undoes them and sets up as without (`init/mod.rs`,
//! `Init::setup_after_ahead`).
//!
//! What a spare has before its plan is what a freshly cloned init has: its own mount, pid,
//! UTS, IPC and network namespaces (the network one made ahead by the [`NetnsReserve`], or
//! its own), signal dispositions at their defaults, the same environment and descriptors.
//! By default it is forked by the reserve's fork server (`init_forker.rs`: no spare pays
//! for loading the init program), whose signal mask (empty) and CPU affinity it has; exec'd
//! (`Runtime::set_forked_spares(false)`, or when the program is not a forker), it was cloned
//! from the reserve's thread and has that thread's. Each is handed out once, oldest first, and two things are checked then:
//! - its mount namespace is a copy of the engine's at the clone: if the engine's mount table
//!   changed since (a mount or unmount in its namespace, the instance cache's tmpfs, a host
//!   mask's), the copy may lack what the plan names, so that init is killed and reaped with
//!   its directory and cgroups, and the next one or a fresh clone is used. The change is seen
//!   through the kernel's own event counter of the namespace: a `/proc/self/mountinfo` opened
//!   before the clone polls `POLLPRI` once the table changed;
//! - it may have died (killed from outside): it is reaped, never signalled again, not used.
//!
//! A spare whose engine dies reads end of file on its socket and exits; the runtime kills and
//! reaps the rest when it goes. A one-shot process never starts the thread: the runtime starts
//! it at its second sandbox. A spare that cannot be started (`EAGAIN` at a pids limit, the
//! init program gone for a while) is tried again after a pause that doubles from
//! [`RETRY_FIRST`] up to [`RETRY_MAX`], and then every [`RETRY_MAX`] for as long as it fails
//! (a failed try costs a clone; a failure that lasts, the program gone or the pids limit
//! reached, fails the creates too). Meanwhile sandboxes clone their inits, as they would with
//! no reserve: nothing is weakened, creates are only slower. The thread starts a spare's
//! replacement only once the sandbox that took it has answered its first request (see
//! [`InitReserve::refill`]); creates faster than
//! that clone their inits.
//!
//! [`Runtime::create`]: crate::Runtime::create
//! [`NetnsReserve`]: crate::netns::NetnsReserve

use crate::cgroup::Cgroup;
use crate::netns::NetnsReserve;
use crate::protocol::{read_frame, write_frame, PreparePlan, Request, Response, SetupPlan};
use crate::runtime::InitProgram;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

/// How many inits the reserve keeps waiting.
pub const DEFAULT_RESERVE: usize = 2;

/// The pause after a spare failed to start, doubled at each failure in a row up to
/// [`RETRY_MAX`].
pub const RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(10);
/// The longest pause between two tries.
pub const RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);

/// The pause before the next try after `failures` failures in a row (at least one).
fn retry_pause(failures: u32) -> std::time::Duration {
    let doublings = failures.saturating_sub(1).min(16);
    RETRY_FIRST.saturating_mul(1 << doublings).min(RETRY_MAX)
}

/// An init that was started ahead and waits for its plan, with the sandbox's name, directory
/// and (limitless until the plan) cgroups made for it.
pub(crate) struct Spare {
    pub pid: i32,
    /// The host's end of its control socket.
    pub sock: UnixStream,
    /// The sandbox's name (`s<N>` of the runtime's counter), directory and cgroups.
    pub name: String,
    pub dir: PathBuf,
    pub cgroup: Cgroup,
    /// Its record for the reaper (`<run>/sbx/<name>.init`, as any sandbox's init).
    pub record: PathBuf,
    /// The engine's mount table, opened before the clone (see the module).
    mounts: File,
    /// Already reaped (found dead): its pid may belong to another process now.
    reaped: bool,
}

impl Spare {
    /// Whether it can still be given its plan: alive, and the engine's mount table unchanged
    /// since it was cloned.
    fn usable(&mut self) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            self.mounts.as_fd(),
            nix::poll::PollFlags::POLLPRI,
        )];
        let changed = match nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO) {
            Ok(_) => fds[0].revents().is_none_or(|r| {
                r.intersects(nix::poll::PollFlags::POLLPRI | nix::poll::PollFlags::POLLERR)
            }),
            Err(_) => true,
        };
        if changed {
            return false;
        }
        // Our own child, not yet reaped: its pid cannot have been reused. One that exited is
        // reaped here, and never signalled again.
        match nix::sys::wait::waitpid(
            nix::unistd::Pid::from_raw(self.pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        ) {
            Ok(nix::sys::wait::WaitStatus::StillAlive) => true,
            Ok(_) => {
                self.reaped = true;
                false
            }
            // Not our child to wait for any more (reaped elsewhere, or SIGCHLD ignored): its
            // pid is never signalled.
            Err(_) => {
                self.reaped = true;
                false
            }
        }
    }

    /// Kill and reap it, and remove its record, cgroups and directory.
    pub fn discard(mut self) {
        if !self.reaped {
            // SAFETY: kill with integer arguments; the pid is our own child, not yet reaped
            // (one that already exited is a zombie until this waitpid: the pid is not reused).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(self.pid), None);
        }
        if let Err(e) = self.cgroup.destroy() {
            tracing::warn!(sandbox = %self.name, error = %e, "cgroup cleanup failed");
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = std::fs::remove_file(&self.record);
    }
}

#[derive(Default)]
struct State {
    ready: Vec<Spare>,
    stop: bool,
    started: bool,
    /// The thread could not be started (sandboxes clone their inits).
    failed: bool,
    /// The thread waits out a pause after a failure (nothing to do until it ends).
    pausing: bool,
    /// Spares that failed to start, in all.
    failures: u64,
    /// Spares handed out, and spares discarded at hand-out as stale or dead.
    taken: u64,
    discarded: u64,
    /// The init forker's pid while one runs (`init_forker.rs`).
    forker: Option<i32>,
}

/// Where a runtime's sandboxes go: what the reserve needs to make a spare's name, directory
/// and cgroups as `Runtime::create` would.
pub(crate) struct Place {
    pub run: String,
    /// `<run>/sbx`: the sandboxes' directories and the records.
    pub sbx: PathBuf,
    pub cgroups: crate::cgroup::Layout,
    /// The runtime's counter of sandbox names.
    pub counter: Arc<AtomicU64>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when the thread may refill ([`InitReserve::refill`]) and when the reserve
    /// stops.
    wake: Condvar,
    target: usize,
    init: InitProgram,
    place: Place,
    netns: Arc<NetnsReserve>,
    /// Whether spares are forked by the init forker (`init_forker.rs`), else exec'd.
    forked: std::sync::atomic::AtomicBool,
    /// Whether spares make the expected plan's root ahead ([`InitReserve::set_roots_ahead`]).
    roots_ahead: std::sync::atomic::AtomicBool,
    /// The plan the next spares make their root for, and the last create's plan.
    expected: Mutex<Expected>,
}

/// Which plan spares make their root for: the runtime's first plan, then a plan only once two
/// creates in a row had it. A runtime whose every create has a new plan (an image build adds a
/// layer at each step) would otherwise pay for undoing a root at every create.
#[derive(Default)]
struct Expected {
    ahead: Option<Box<SetupPlan>>,
    last: Option<SetupPlan>,
}

/// The runtime's reserve of started inits (see the module).
pub(crate) struct InitReserve {
    shared: Arc<Shared>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl InitReserve {
    /// A reserve that keeps `target` inits of `init` waiting once started (0: never starts
    /// any) for sandboxes of `place`, in network namespaces from `netns` when it has one ready.
    pub fn new(target: usize, init: InitProgram, place: Place, netns: Arc<NetnsReserve>) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                target,
                init,
                place,
                netns,
                forked: std::sync::atomic::AtomicBool::new(true),
                roots_ahead: std::sync::atomic::AtomicBool::new(true),
                expected: Mutex::new(Expected::default()),
            }),
            thread: Mutex::new(None),
        }
    }

    /// Start the background thread, once.
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
            .name("init-reserve".into())
            .spawn(move || fill(&shared));
        match spawned {
            Ok(h) => *crate::lock(&self.thread) = Some(h),
            Err(e) => {
                crate::lock(&self.shared.state).failed = true;
                tracing::debug!(error = %e, "init reserve not started");
            }
        }
    }

    /// A waiting init, never handed out before, or `None` if none is ready and usable now
    /// (stale or dead ones met on the way are killed and reaped). The thread starts new ones
    /// at the next [`InitReserve::refill`].
    pub fn take(&self) -> Option<Spare> {
        loop {
            let mut spare = {
                let mut st = crate::lock(&self.shared.state);
                // The oldest first: once the mount table changed, every spare older than
                // the change is stale, and all of them go before a newer one is used.
                if st.ready.is_empty() {
                    return None;
                }
                let s = st.ready.remove(0);
                st.taken += 1;
                s
            };
            if spare.usable() {
                return Some(spare);
            }
            tracing::debug!(pid = spare.pid, "a spare init was stale or dead: discarded");
            crate::lock(&self.shared.state).discarded += 1;
            spare.discard();
        }
    }

    /// Let the thread start the ones taken again. The runtime calls this once the sandbox
    /// that took one has answered its first request (or was dropped, or its create failed):
    /// a refill cloned meanwhile would compete with that setup and first command for the
    /// CPUs (measured: 1.4 ms more for create + first exec on 2 cores when the refill started
    /// at hand-out).
    pub fn refill(&self) {
        self.shared.wake.notify_all();
    }

    /// The host pids of the inits waiting now, oldest first.
    pub fn pids(&self) -> Vec<i32> {
        crate::lock(&self.shared.state)
            .ready
            .iter()
            .map(|s| s.pid)
            .collect()
    }

    /// Inits waiting now.
    pub fn ready(&self) -> usize {
        crate::lock(&self.shared.state).ready.len()
    }

    /// Whether the thread has nothing to do now: the reserve is full, stopped, never
    /// started, or pausing after a spare failed to start.
    pub fn idle(&self) -> bool {
        let st = crate::lock(&self.shared.state);
        !st.started || st.stop || st.failed || st.pausing || st.ready.len() >= self.shared.target
    }

    /// Whether spares started from now on are forked by the init forker (the default) or
    /// exec'd (see `init_forker.rs`).
    pub fn set_forked(&self, on: bool) {
        self.shared.forked.store(on, Ordering::Relaxed);
    }

    /// The plan of a create that just succeeded. Spares started from now on mount its root
    /// and start its zygote while they wait when it is the runtime's first plan or the last
    /// create's too (same root and confinement), else they wait without ([`Expected`]); never
    /// while [`InitReserve::set_roots_ahead`] is off.
    pub fn expect(&self, plan: SetupPlan) {
        // Nothing of the create that had it but its root and confinement is kept: no
        // directory or cgroups (each spare's own go in), no host name, no environment (which
        // may hold a secret of that sandbox's) reach the spares.
        let plan = SetupPlan {
            sandbox_dir: String::new(),
            cgroup_join: Vec::new(),
            hostname: String::new(),
            env: Vec::new(),
            ..plan
        };
        let mut e = crate::lock(&self.shared.expected);
        let again = e
            .last
            .as_ref()
            .is_none_or(|last| last.same_root_and_confinement(&plan));
        e.ahead = (again && self.shared.roots_ahead.load(Ordering::Relaxed))
            .then(|| Box::new(plan.clone()));
        e.last = Some(plan);
    }

    /// Whether spares started from now on make the expected plan's root ahead.
    pub fn set_roots_ahead(&self, on: bool) {
        self.shared.roots_ahead.store(on, Ordering::Relaxed);
        if !on {
            crate::lock(&self.shared.expected).ahead = None;
        }
    }

    /// The init forker's pid while one runs.
    pub fn forker_pid(&self) -> Option<i32> {
        crate::lock(&self.shared.state).forker
    }

    /// Spares that failed to start (each tried again after a pause; see the module).
    pub fn failures(&self) -> u64 {
        crate::lock(&self.shared.state).failures
    }

    /// Spares handed out by [`InitReserve::take`] and, of those, the ones discarded there.
    pub fn counts(&self) -> (u64, u64) {
        let st = crate::lock(&self.shared.state);
        (st.taken - st.discarded, st.discarded)
    }

    /// Stop the thread, and kill and reap every waiting init.
    pub fn stop(&self) {
        crate::lock(&self.shared.state).stop = true;
        self.shared.wake.notify_all();
        if let Some(h) = crate::lock(&self.thread).take() {
            let _ = h.join();
        }
        let ready = std::mem::take(&mut crate::lock(&self.shared.state).ready);
        for s in ready {
            s.discard();
        }
    }
}

impl Drop for InitReserve {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The thread: keep `target` inits waiting until stopped.
fn fill(shared: &Shared) {
    let mut in_a_row = 0u32;
    // Dropped (killed and reaped) when the thread ends.
    let mut forker = crate::init_forker::ForkerSlot::default();
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
        let started = start_one(shared, &mut forker);
        crate::lock(&shared.state).forker = forker.pid();
        match started {
            Ok(spare) => {
                let mut st = crate::lock(&shared.state);
                if st.stop {
                    drop(st);
                    spare.discard();
                    return;
                }
                st.ready.push(spare);
                in_a_row = 0;
                tracing::trace!(
                    us = t0.elapsed().as_micros() as u64,
                    ready = st.ready.len(),
                    "init started ahead"
                );
            }
            Err(e) => {
                // Sandboxes clone their own init meanwhile; nothing is weakened.
                in_a_row += 1;
                let mut st = crate::lock(&shared.state);
                st.failures += 1;
                let pause = retry_pause(in_a_row);
                tracing::debug!(error = %e, failures = in_a_row, pause_ms = pause.as_millis() as u64, "a spare init failed to start: tried again after a pause");
                // The whole pause, whatever wakes the thread before (a refill), unless stopped.
                st.pausing = true;
                st = shared
                    .wake
                    .wait_timeout_while(st, pause, |st| !st.stop)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|p| p.into_inner().0);
                st.pausing = false;
                if st.stop {
                    return;
                }
            }
        }
    }
}

fn start_one(
    shared: &Shared,
    forker: &mut crate::init_forker::ForkerSlot,
) -> Result<Spare, crate::SandboxError> {
    let spawn = |what| move |source| crate::SandboxError::Spawn { what, source };
    let place = &shared.place;
    let name = format!("s{}", place.counter.fetch_add(1, Ordering::Relaxed));
    let dir = place.sbx.join(&name);
    std::fs::create_dir(&dir).map_err(spawn("creating the sandbox directory"))?;
    let cgroup = match Cgroup::create_bare(&place.cgroups, &place.run, &name) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_dir(&dir);
            return Err(e.into());
        }
    };
    let made = (|| {
        // Opened before the clone: any change of the table after it is seen at hand-out.
        let mounts =
            File::open("/proc/self/mountinfo").map_err(spawn("opening our mount table"))?;
        let (sock, child_sock) = UnixStream::pair().map_err(spawn("socketpair"))?;
        let (child_sock, netns) = (child_sock.into(), shared.netns.take());
        let pid = if shared.forked.load(Ordering::Relaxed) {
            forker.start_init(&shared.init, child_sock, netns)?
        } else {
            crate::spawn_init::spawn_init(&shared.init, child_sock, netns)?
        };
        Ok::<_, crate::SandboxError>((mounts, sock, pid))
    })();
    let (mounts, sock, pid) = match made {
        Ok(m) => m,
        Err(e) => {
            drop(cgroup);
            let _ = std::fs::remove_dir(&dir);
            return Err(e);
        }
    };
    let mut spare = Spare {
        pid,
        sock,
        record: place.sbx.join(format!("{name}.init")),
        name,
        dir,
        cgroup,
        mounts,
        reaped: false,
    };
    let prepare = Request::Prepare(Box::new(PreparePlan {
        sandbox_dir: spare.dir.to_string_lossy().into_owned(),
        cgroup_join: spare.cgroup.self_join_files(),
        expected: crate::lock(&shared.expected).ahead.clone(),
    }));
    let recorded = std::fs::write(&spare.record, crate::state::identity(pid))
        .map_err(spawn("recording a spare init"));
    // Ready only once it answered: a spare whose preparation failed never reaches a create,
    // and one still preparing is not counted as ready.
    let answered = recorded.and_then(|()| {
        write_frame(&mut spare.sock, "request", &prepare)?;
        spare
            .sock
            .set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .map_err(crate::protocol::ProtocolError::Io)?;
        match read_frame::<Response>(&mut spare.sock, "response")? {
            Response::Ok => Ok(()),
            other => Err(crate::SandboxError::Setup(format!(
                "preparing a spare init: {other:?}"
            ))),
        }
    });
    if let Err(e) = answered {
        spare.discard();
        return Err(e);
    }
    Ok(spare)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_from_the_first_up_to_the_longest() {
        let ms: Vec<u128> = (1..=12).map(|n| retry_pause(n).as_millis()).collect();
        assert_eq!(
            ms,
            [10, 20, 40, 80, 160, 320, 640, 1280, 2000, 2000, 2000, 2000]
        );
        assert_eq!(retry_pause(0), RETRY_FIRST);
        assert_eq!(retry_pause(u32::MAX), RETRY_MAX);
    }
}
