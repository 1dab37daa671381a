//! Starting a sandbox's init: a child cloned into new namespaces that execs the init program
//! with the control socket on fd 3.
//!
//! The child is cloned the way `posix_spawn` starts a program: `CLONE_VM | CLONE_VFORK`, on a
//! stack of its own ([`crate::init::spawn::Stack`]). A fork-like clone of the engine (a large,
//! multi-threaded process) copied its page tables, and every page the engine then wrote took
//! a fault; here nothing is copied and the calling thread is suspended by the kernel until
//! the child has exec'd or exited. The namespaces are the same (`CLONE_NEWNS | CLONE_NEWPID |
//! CLONE_NEWUTS | CLONE_NEWIPC`, and `CLONE_NEWNET` unless a namespace made ahead is
//! entered), and so is what init starts with: the same descriptors, environment and signal
//! mask (the caller's, saved and restored by the kernel's `rt_sigprocmask`). Every signal
//! disposition starts at its default (before, a signal ignored where the
//! engine was started, a supervisor's SIGQUIT say, stayed ignored in init and in every command).
//!
//! The child shares the engine's memory until `execve`, so it touches only what was built
//! before the clone ([`Child`]) and makes plain system calls: no allocation, no lock, no
//! unwinding. All signals are blocked in the calling thread across the clone, so no handler
//! of the engine can run on the child's stack; the child resets every disposition to the
//! default before it restores the mask.

use crate::error::SandboxError;
use crate::init::spawn::{pointers, Stack};
use crate::runtime::InitProgram;
use std::ffi::{c_int, c_void, CString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

/// What the child reads, built before the clone.
struct Child {
    path: CString,
    argv: Vec<*const libc::c_char>,
    env: [*const libc::c_char; 2],
    /// A network namespace made ahead to enter, or -1.
    net_fd: i32,
    /// The control socket, moved to [`crate::init::CONTROL_FD`].
    sock_fd: i32,
    /// The caller's signal mask (the kernel's 64-bit set), which init starts with.
    mask: u64,
    /// Written by the child when it cannot exec init: the errno of `execve`, or minus the
    /// errno of entering the network namespace (read once the clone has returned).
    failed: AtomicI32,
}

/// Clone a child into new namespaces and exec the init program in it with the control socket
/// on fd 3. With `netns` (a network namespace made ahead, never used before) the child
/// enters it instead of cloning a new one; the host's descriptor on it is closed when this
/// returns. Returns init's pid (in this pid namespace).
pub(crate) fn spawn_init(
    init: &InitProgram,
    sock: OwnedFd,
    netns: Option<OwnedFd>,
) -> Result<i32, SandboxError> {
    let bad = |reason: &str| SandboxError::InitProgram {
        path: init.path.clone(),
        reason: reason.into(),
    };
    use std::os::unix::ffi::OsStrExt;
    let path = CString::new(init.path.as_os_str().as_bytes()).map_err(|_| bad("NUL in path"))?;
    let mut args = vec![path.clone()];
    for a in &init.args {
        args.push(CString::new(a.as_bytes()).map_err(|_| bad("NUL in argument"))?);
    }
    let stack = Stack::new().map_err(|e| SandboxError::Spawn {
        what: "mapping the init child's stack",
        source: std::io::Error::from_raw_os_error(e),
    })?;
    let mut flags =
        libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC;
    if netns.is_none() {
        flags |= libc::CLONE_NEWNET;
    }
    flags |= libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD;
    let mut child = Child {
        argv: pointers(&args),
        path,
        env: [
            c"PATH=/usr/sbin:/usr/bin:/sbin:/bin".as_ptr(),
            std::ptr::null(),
        ],
        // Close-on-exec (opened so): init never holds it as a descriptor, only as its namespace.
        net_fd: netns.as_ref().map_or(-1, |f| f.as_raw_fd()),
        sock_fd: sock.as_raw_fd(),
        mask: 0, // filled in below, before the clone
        failed: AtomicI32::new(0),
    };
    // SAFETY: (whole block) blocking every signal in this thread around the clone (and
    // restoring its mask after) with sets we own; `run_child` runs on `stack` in our memory
    // and only reads `child`, which lives across the call: the kernel keeps this thread
    // suspended until the child has exec'd or exited (CLONE_VFORK), and the child never
    // returns into our frames.
    let pid = unsafe {
        // The kernel's call with every bit set: the C library's would leave its own two
        // real-time signals (32, 33) deliverable, with its handlers, until the child resets them.
        set_mask(&u64::MAX, &mut child.mask);
        let pid = libc::clone(
            run_child,
            stack.top(),
            flags,
            (&child as *const Child).cast_mut().cast(),
        );
        let e = std::io::Error::last_os_error();
        set_mask(&child.mask, std::ptr::null_mut());
        if pid < 0 {
            return Err(SandboxError::Spawn {
                what: "clone into new namespaces",
                source: e,
            });
        }
        pid
    };
    drop(stack); // the child has exec'd (or exited): it no longer runs on it
    let failed = child.failed.load(Ordering::SeqCst);
    if failed != 0 {
        // The child exited without becoming init: reap it and say why.
        // SAFETY: waiting for our own child, which has exited or is exiting.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        return Err(if failed > 0 {
            SandboxError::InitProgram {
                path: init.path.clone(),
                reason: format!(
                    "cannot be executed: {}",
                    std::io::Error::from_raw_os_error(failed)
                ),
            }
        } else {
            SandboxError::Spawn {
                what: "entering a network namespace made ahead",
                source: std::io::Error::from_raw_os_error(-failed),
            }
        });
    }
    drop(sock);
    drop(netns); // init holds the only reference now
    Ok(pid)
}

/// Set the calling thread's signal mask to `set` (the kernel's 64-bit set), the old one into
/// `old` unless it is null: the kernel's call, which also covers the C library's own two
/// real-time signals.
///
/// # Safety
/// `old` is null or valid for a write of a `u64`.
unsafe fn set_mask(set: &u64, old: *mut u64) {
    // SAFETY: both pointers are valid for the 8 bytes the kernel reads or writes.
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            set as *const u64,
            old,
            8usize,
        )
    };
}

/// The child, on its own stack, in the engine's memory: plain system calls only.
extern "C" fn run_child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Child` that `spawn_init` passed, alive until we exec or exit.
    let c = unsafe { &*(arg as *const Child) };
    // SAFETY: (whole block) system calls on descriptors, strings and sets the plan holds; the
    // C library's wrappers used here (setns, fcntl, dup2, execve, _exit) take
    // no lock and do not allocate.
    unsafe {
        if c.net_fd >= 0 && crate::netns::enter(c.net_fd) != 0 {
            c.failed
                .store(-nix::errno::Errno::last_raw(), Ordering::SeqCst);
            libc::_exit(126);
        }
        if c.sock_fd == crate::init::CONTROL_FD {
            libc::fcntl(c.sock_fd, libc::F_SETFD, 0);
        } else {
            libc::dup2(c.sock_fd, crate::init::CONTROL_FD);
        }
        // The engine's handlers must never run here (they would run on this stack, in the
        // engine's memory), and no signal ignored where the engine was started stays ignored: every
        // disposition goes back to its default, ignored ones too (a supervisor's or a background
        // job's SIG_IGN). The kernel's call, not the C library's: that one refuses the C
        // library's own two real-time signals. An all-zero `struct sigaction` is SIG_DFL with
        // no flags and an empty mask in every architecture's layout.
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                );
            }
        }
        set_mask(&c.mask, std::ptr::null_mut());
        libc::execve(c.path.as_ptr(), c.argv.as_ptr(), c.env.as_ptr());
        // Still in the engine's memory: the caller reads this once the clone returns.
        c.failed
            .store(nix::errno::Errno::last_raw().max(1), Ordering::SeqCst);
        libc::_exit(127)
    }
}
