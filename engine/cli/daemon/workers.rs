//! The daemon's serving threads, kept between requests: a thread's start and end (its stack,
//! its signal stack, its name, and at the end the stack given back) would otherwise be on
//! every request's path, twice (the thread that serves, and the one that watches for the
//! client's hangup meanwhile).
//!
//! [`Workers`] runs each request on a thread that waits for work, or on a new one when none
//! waits; waiting threads end one at a time, each after [`IDLE_EXIT`] without work (after a
//! burst of k threads, the last of the extra ones ends about k times `IDLE_EXIT` later).
//! [`until_hangup`] watches a client through a watcher thread of the serving thread's own,
//! started on its first request and ended with it.

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use std::cell::RefCell;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long the waiting thread that is next in line for a request waits before it ends.
pub const IDLE_EXIT: Duration = Duration::from_secs(60);

type Job = Box<dyn FnOnce() + Send>;

/// Threads that run jobs and wait for more.
pub struct Workers {
    tx: Sender<Job>,
    rx: Arc<Mutex<Receiver<Job>>>,
    /// Threads waiting for a job and not yet promised one by [`Workers::run`].
    idle: Arc<AtomicUsize>,
    name: &'static str,
}

impl Workers {
    pub fn new(name: &'static str) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        Self {
            tx,
            rx: Arc::new(Mutex::new(rx)),
            idle: Arc::new(AtomicUsize::new(0)),
            name,
        }
    }

    /// Run `job` on a waiting thread, else on a new one. An error when no thread could be
    /// started (the job is then dropped unrun).
    pub fn run(&self, job: Job) -> std::io::Result<()> {
        // Promise the job to a waiting thread, if any: each job sent has a thread of its own
        // (a waiting one, or the one started here), so no job waits behind another.
        let promised = self
            .idle
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if !promised {
            let (rx, idle) = (self.rx.clone(), self.idle.clone());
            std::thread::Builder::new()
                .name(self.name.into())
                .spawn(move || work(&rx, &idle))?;
        }
        // `self.rx` keeps the receiver alive, so this cannot fail.
        self.tx
            .send(job)
            .map_err(|_| std::io::Error::other("no serving thread took the request"))
    }
}

fn work(rx: &Mutex<Receiver<Job>>, idle: &AtomicUsize) {
    // Started for a job: the first is this thread's.
    loop {
        let job = {
            let rx = rx.lock().unwrap_or_else(|p| p.into_inner());
            match rx.recv_timeout(IDLE_EXIT) {
                Ok(j) => Some(j),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => None,
            }
        };
        match job {
            Some(job) => {
                job();
                idle.fetch_add(1, Ordering::SeqCst);
            }
            // Idle too long: end, unless a job was promised to this thread meanwhile (it is
            // taken on the next turn then).
            None => {
                if idle
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
                {
                    return;
                }
            }
        }
    }
}

/// What a watcher watches: a client (a descriptor of its own on the same connection), the
/// pidfd of the init to kill when the client goes, and the read end of a pipe whose write
/// end closes when the command has ended.
struct Watch {
    client: OwnedFd,
    init: OwnedFd,
    done: OwnedFd,
    pid: i32,
}

thread_local! {
    /// This serving thread's watcher (`None` until its first request, or when none could be
    /// started).
    static WATCHER: RefCell<Option<Sender<Watch>>> = const { RefCell::new(None) };
}

/// The watcher of this thread, started if it has none (or forgotten, see [`until_hangup`]).
fn watcher() -> std::io::Result<Sender<Watch>> {
    WATCHER.with(|w| {
        if let Some(tx) = w.borrow().as_ref() {
            return Ok(tx.clone());
        }
        let (tx, rx) = std::sync::mpsc::channel::<Watch>();
        std::thread::Builder::new()
            .name("hangup".into())
            .spawn(move || {
                // Ends when the serving thread does (its sender goes with it).
                for w in rx {
                    watch(&w);
                }
            })?;
        *w.borrow_mut() = Some(tx.clone());
        Ok(tx)
    })
}

/// Poll until the command is done or the client goes; kill init in the second case.
fn watch(w: &Watch) {
    let mut fds = [
        PollFd::new(w.client.as_fd(), PollFlags::POLLIN),
        PollFd::new(w.done.as_fd(), PollFlags::POLLIN),
    ];
    loop {
        match poll(&mut fds, PollTimeout::NONE) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return,
            Ok(_) => {}
        }
        if fds[1].revents().is_some_and(|r| !r.is_empty()) {
            return;
        }
        if fds[0].revents().is_some_and(|r| !r.is_empty()) {
            tracing::debug!(
                init = w.pid,
                "the one-shot's client went away: its command is killed"
            );
            pidfd_signal(&w.init, libc::SIGKILL);
            return;
        }
    }
}

/// Run `f` (a command in the sandbox whose init is `init`); if the client hangs up (or sends
/// anything: it has nothing more to say) meanwhile, kill that init through a pidfd taken
/// before, which ends the command and the sandbox. (The watcher may look a moment longer
/// than `f` runs: a kill then finds the init the caller stops anyway.) Without a pidfd, a
/// pipe or a watcher, `f` runs unwatched (the command then ends at its timeout).
pub fn until_hangup<T>(client: &UnixStream, init: i32, f: impl FnOnce() -> T) -> T {
    let prepared = (|| -> std::io::Result<_> {
        let watch_client = client.as_fd().try_clone_to_owned()?;
        let pidfd = pidfd_open(init)?;
        let (done_r, done_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let w = Watch {
            client: watch_client,
            init: pidfd,
            done: done_r,
            pid: init,
        };
        if let Err(std::sync::mpsc::SendError(w)) = watcher()?.send(w) {
            // This thread's watcher has ended (it cannot, short of a panic): a new one.
            WATCHER.with(|t| *t.borrow_mut() = None);
            watcher()?
                .send(w)
                .map_err(|_| std::io::Error::other("the hangup watcher has ended"))?;
        }
        Ok(done_w)
    })();
    match prepared {
        Ok(done_w) => {
            let out = f();
            drop(done_w);
            out
        }
        Err(e) => {
            tracing::warn!(init, error = %e, "a one-shot's command runs unwatched");
            f()
        }
    }
}

/// Send `sig` (0: none, a check that the process is there) to the process of a pidfd;
/// whether the kernel took it.
pub(super) fn pidfd_signal(fd: &OwnedFd, sig: libc::c_int) -> bool {
    // SAFETY: pidfd_send_signal with a descriptor we own, a signal number and no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0
}

/// A pidfd of process `pid` (signals through it never reach another process that got the
/// same pid later).
fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes two integers and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::sync::Barrier;

    /// Jobs given at once all run at once (none waits behind another), and later jobs run on
    /// the threads that waited, not on new ones.
    #[test]
    fn jobs_run_at_once_and_threads_are_kept_for_the_next() {
        let w = Workers::new("test-worker");
        let n = 6;
        // Each job waits for all the others (a job queued behind another never gets past it, and
        // the round then fails on its timeout); the threads that ran a round's jobs.
        let round = || {
            let barrier = Arc::new(Barrier::new(n));
            let (tx, rx) = channel();
            for _ in 0..n {
                let (b, tx) = (barrier.clone(), tx.clone());
                w.run(Box::new(move || {
                    b.wait();
                    tx.send(std::thread::current().id()).unwrap();
                }))
                .unwrap();
            }
            (0..n)
                .map(|_| rx.recv_timeout(Duration::from_secs(10)).unwrap())
                .collect::<std::collections::HashSet<_>>()
        };
        let first = round();
        assert_eq!(first.len(), n);
        // Once they are all back to waiting, a new round runs on the same threads.
        let t = std::time::Instant::now();
        while w.idle.load(Ordering::SeqCst) < n {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the threads never waited again"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(round(), first, "the second round ran on other threads");
    }

    /// A child killed and reaped when the test ends, however it ends.
    struct Child(std::process::Child);

    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A watched command whose client hangs up has its process killed; one whose client stays
    /// is left alone, and the watcher is free for the next.
    #[test]
    fn a_client_that_hangs_up_has_its_process_killed() {
        use std::os::unix::process::ExitStatusExt;
        let spawn = || {
            Child(
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap(),
            )
        };
        // The client stays: `f` returns by itself, the process lives.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut kept = spawn();
        let r = until_hangup(&ours, kept.0.id() as i32, || 7);
        assert_eq!(r, 7);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            kept.0.try_wait().unwrap().is_none(),
            "killed without a hangup"
        );
        // A hangup once `f` has returned kills nothing: the watch ended with `f`.
        drop(theirs);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            kept.0.try_wait().unwrap().is_none(),
            "killed by a hangup after the command had ended"
        );
        // The client goes while `f` runs: the process is killed, and `f` sees it end.
        let (ours, theirs) = UnixStream::pair().unwrap();
        let mut victim = spawn();
        let pid = victim.0.id() as i32;
        let status = until_hangup(&ours, pid, || {
            drop(theirs);
            victim.0.wait().unwrap()
        });
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
