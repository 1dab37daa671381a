//! SIGINT, SIGTERM and SIGHUP: the run stops cleanly instead of leaving its mounts, cgroups
//! and run directory to the next reaper.
//!
//! The handler only records the signal and wakes a watcher thread through a pipe (both
//! async-signal-safe). A command that stops on its own between units of work (`engine run`
//! checks [`STOP`] between episodes, then tears down and writes what it measured) declares
//! itself [`cooperative`]; for every other command, and at a second signal, the watcher tears
//! the process's own runs down ([`sandbox::state::reap_run`]) and exits. A command that
//! [`supervise`]s child processes (`engine sweep`) passes each signal on to them, one for
//! one, and returns once they have exited; the watcher then never exits by itself. Either
//! way the exit status is 128 + the signal: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP.
//! A one-shot waiting for the daemon to run its command has nothing to tear down: while it
//! waits ([`exit_at_once`]), the handler itself exits.

pub use crate::oneshot::outcome::signal_exit_status as exit_status;
use crate::oneshot::outcome::signal_name as name;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Set when a signal asked the process to stop.
pub static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: AtomicI32 = AtomicI32::new(0);
static WAKE: AtomicI32 = AtomicI32::new(-1);
static COOPERATIVE: AtomicBool = AtomicBool::new(false);
/// Set by a command that passes every signal on to its children ([`supervise`]).
static SUPERVISOR: AtomicBool = AtomicBool::new(false);
/// Signals received and not yet taken by [`take_pending`] (a supervisor's), by kind.
static PENDING: [AtomicUsize; 3] = [
    AtomicUsize::new(0),
    AtomicUsize::new(0),
    AtomicUsize::new(0),
];
/// Signals received so far.
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// The runs of this process, torn down by the watcher when it has to exit by itself.
static RUNS: Mutex<Vec<(PathBuf, Vec<PathBuf>, String)>> = Mutex::new(Vec::new());

/// Files removed when the watcher ends the process (a daemon's socket).
static REMOVE_ON_EXIT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Remove `path` when a signal ends the process (the watcher's exit).
pub fn remove_on_exit(path: PathBuf) {
    REMOVE_ON_EXIT
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(path);
}

/// The signals handled.
const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

extern "C" fn on_signal(sig: libc::c_int) {
    if EXIT_AT_ONCE.load(Ordering::SeqCst) {
        // SAFETY: _exit(2) is async-signal-safe.
        unsafe { libc::_exit(exit_status(sig)) };
    }
    let _ = SIGNAL.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
    STOP.store(true, Ordering::SeqCst);
    COUNT.fetch_add(1, Ordering::SeqCst);
    if let Some(k) = SIGNALS.iter().position(|s| *s as libc::c_int == sig) {
        PENDING[k].fetch_add(1, Ordering::SeqCst);
    }
    let fd = WAKE.load(Ordering::SeqCst);
    if fd >= 0 {
        let b = [sig as u8];
        // SAFETY: write(2) is async-signal-safe; the buffer is a live local.
        unsafe { libc::write(fd, b.as_ptr().cast(), 1) };
    }
}

/// The read end of the signal pipe until the watcher takes it.
static WATCH_END: Mutex<Option<OwnedFd>> = Mutex::new(None);

/// Install the handlers; with `watch_now`, start the watcher too, else [`start_watcher`]
/// does (a signal that comes before waits in the pipe and is acted on then). Handlers are
/// reset to the default in every program the sandboxes execute (execve does that), so
/// commands see signals as usual.
pub fn install(watch_now: bool) {
    let (r, w) = match nix::unistd::pipe() {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "no signal pipe: signals keep their default action");
            return;
        }
    };
    // The write end lives as long as the process (the handler may use it at any time).
    WAKE.store(w.as_raw_fd(), Ordering::SeqCst);
    std::mem::forget(w);
    *WATCH_END.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    if watch_now && !start_watcher() {
        return;
    }
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    for s in SIGNALS {
        // SAFETY: the handler only makes async-signal-safe calls (atomics, write).
        if let Err(e) = unsafe { sigaction(s, &action) } {
            tracing::warn!(signal = %s, error = %e, "could not handle a signal");
        }
    }
}

/// While set, a signal ends the process at once with 128 + the signal (see [`exit_at_once`]).
static EXIT_AT_ONCE: AtomicBool = AtomicBool::new(false);

/// While the returned guard lives, SIGINT, SIGTERM and SIGHUP end the process at once with
/// 128 + the signal, as the watcher would, without a watcher thread: for a process that holds
/// no sandbox and no run of its own (a one-shot waiting for the daemon, which kills the
/// command when its client goes). A signal that came before is acted on now. When the guard
/// drops (the daemon did not serve, the one-shot makes its own sandbox), signals are the
/// watcher's again.
pub fn exit_at_once() -> ExitAtOnce {
    EXIT_AT_ONCE.store(true, Ordering::SeqCst);
    let sig = SIGNAL.load(Ordering::SeqCst);
    if sig != 0 {
        std::process::exit(exit_status(sig));
    }
    ExitAtOnce(())
}

/// See [`exit_at_once`].
pub struct ExitAtOnce(());

impl Drop for ExitAtOnce {
    fn drop(&mut self) {
        EXIT_AT_ONCE.store(false, Ordering::SeqCst);
    }
}

/// Start the watcher if it is not running yet (`engine sandbox exec` starts it once its
/// sandbox's init is started: until then the process has a single thread, so that init can be
/// forked from it). Returns whether a watcher runs.
pub fn start_watcher() -> bool {
    let Some(r) = WATCH_END.lock().unwrap_or_else(|p| p.into_inner()).take() else {
        return WAKE.load(Ordering::SeqCst) >= 0;
    };
    match std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || watch(r))
    {
        Ok(_) => true,
        Err(e) => {
            tracing::warn!(error = %e, "no signal watcher: signals keep their default action");
            // The handlers may already be installed: back to the default, and a signal that
            // came meanwhile has that action now.
            for s in SIGNALS {
                // SAFETY: restoring the default disposition installs no handler code.
                let _ = unsafe { nix::sys::signal::signal(s, SigHandler::SigDfl) };
            }
            if let Ok(s) = Signal::try_from(SIGNAL.load(Ordering::SeqCst)) {
                let _ = nix::sys::signal::raise(s);
            }
            false
        }
    }
}

/// The running command stops by itself when [`STOP`] is set.
pub fn cooperative() {
    COOPERATIVE.store(true, Ordering::SeqCst);
}

/// The running command supervises child processes (`engine sweep`): it passes every signal
/// on to them ([`take_pending`]), waits for them and returns; the watcher never exits by
/// itself, however many signals come.
pub fn supervise() {
    COOPERATIVE.store(true, Ordering::SeqCst);
    SUPERVISOR.store(true, Ordering::SeqCst);
}

/// The signals received since the last call, in the order SIGINT, SIGTERM, SIGHUP (each as
/// many times as it came), for a supervisor to forward one for one.
pub fn take_pending() -> Vec<i32> {
    let mut out = Vec::new();
    for (k, s) in SIGNALS.iter().enumerate() {
        let n = PENDING[k].swap(0, Ordering::SeqCst);
        out.extend(std::iter::repeat_n(*s as i32, n));
    }
    out
}

/// Remember a runtime's run, for the watcher's teardown.
pub fn track(rt: &sandbox::Runtime) {
    let mut runs = RUNS.lock().unwrap_or_else(|p| p.into_inner());
    runs.push((
        rt.state_dir().to_path_buf(),
        rt.cgroup_roots(),
        rt.run_id().to_string(),
    ));
}

/// Docker daemons (their `DOCKER_HOST`) whose containers made by this process are removed on a
/// signal, like the native runs.
static DOCKER_HOSTS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Remove this process's containers on `client`'s daemon when a signal stops it.
pub fn track_docker(client: &sandbox::docker::Client) {
    let mut hosts = DOCKER_HOSTS.lock().unwrap_or_else(|p| p.into_inner());
    if !hosts.iter().any(|h| h == client.host()) {
        hosts.push(client.host().to_string());
    }
}

/// The signal that stopped the process, if one did.
pub fn received() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Called when the command returns: if the watcher is tearing the process down after a
/// signal (a command that does not stop by itself, or a second signal), the exit is the
/// watcher's, so a command that failed because its sandbox was just killed reports nothing.
/// A one-shot that ended before its watcher started (it failed before its init started, or
/// a daemon served it) gets one here only when a signal came, to act on it: without a signal
/// it exits with no thread started.
pub fn before_exit() {
    let n = COUNT.load(Ordering::SeqCst);
    if n > 0 && !SUPERVISOR.load(Ordering::SeqCst) && (!COOPERATIVE.load(Ordering::SeqCst) || n > 1)
    {
        start_watcher();
        loop {
            std::thread::park();
        }
    }
}

fn watch(r: OwnedFd) {
    let mut seen = 0;
    let mut buf = [0u8; 1];
    loop {
        match nix::unistd::read(r.as_raw_fd(), &mut buf) {
            Ok(1) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            _ => return,
        }
        seen += 1;
        let sig = i32::from(buf[0]);
        if SUPERVISOR.load(Ordering::SeqCst) {
            eprintln!(
                "engine: {}: passed on to the running points (they checkpoint; again to stop them now)",
                name(sig)
            );
            continue;
        }
        if COOPERATIVE.load(Ordering::SeqCst) && seen == 1 {
            eprintln!(
                "engine: {}: stopping after the running episodes (again to stop now)",
                name(sig)
            );
            continue;
        }
        for path in REMOVE_ON_EXIT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            let _ = std::fs::remove_file(path);
        }
        let runs = std::mem::take(&mut *RUNS.lock().unwrap_or_else(|p| p.into_inner()));
        for (state, roots, run) in &runs {
            let r = sandbox::state::reap_run(state, roots, run);
            tracing::info!(run = %run, processes = r.processes, mounts = r.mounts, cgroups = r.cgroups, "torn down on a signal");
        }
        // A client of its own: the command's may be busy on another thread.
        let hosts = std::mem::take(&mut *DOCKER_HOSTS.lock().unwrap_or_else(|p| p.into_inner()));
        for host in hosts {
            if let Ok(client) = sandbox::docker::Client::connect(&host) {
                let work = std::env::temp_dir();
                let removed = sandbox::docker::DockerBackend::new(client, &work).remove_own();
                tracing::info!(host = %host, containers = removed, "docker containers removed on a signal");
            }
        }
        eprintln!("engine: {}: sandboxes torn down", name(sig));
        std::process::exit(exit_status(SIGNAL.load(Ordering::SeqCst).max(sig)));
    }
}
