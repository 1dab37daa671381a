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
        env: [INIT_ENV.as_ptr(), std::ptr::null()],
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
        // engine's memory).
        default_dispositions(&[]);
        set_mask(&c.mask, std::ptr::null_mut());
        libc::execve(c.path.as_ptr(), c.argv.as_ptr(), c.env.as_ptr());
        // Still in the engine's memory: the caller reads this once the clone returns.
        c.failed
            .store(nix::errno::Errno::last_raw().max(1), Ordering::SeqCst);
        libc::_exit(127)
    }
}

/// Every signal disposition back to its default, ignored ones too (a supervisor's or a
/// background job's SIG_IGN, which would otherwise stay ignored in init and in every command).
/// The kernel's call, not the C library's: that one refuses the C library's own two real-time
/// signals. An all-zero `struct sigaction` is SIG_DFL with no flags and an empty mask in every
/// architecture's layout.
///
/// # Safety
/// Only in a child about to become init, with every signal blocked; `keep` keeps what it
/// names as it is.
unsafe fn default_dispositions(keep: &[c_int]) {
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP && !keep.contains(&sig) {
            // SAFETY: the kernel reads one `struct sigaction` from `dfl` and writes nothing.
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    dfl.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                )
            };
        }
    }
}

/// Whether this process has a single thread (the kernel's count in `/proc/self/stat`): then
/// a fork-like child may run ordinary code, since no other thread can hold a lock it needs.
pub(crate) fn single_threaded() -> bool {
    self_stat().is_some_and(|f| f.get(20) == Some(&1))
}

/// The numeric fields of `/proc/self/stat`, indexed by their number in proc(5) (1-based;
/// fields 1 and 2, the pid and the command name, and any field that is not a number read 0).
fn self_stat() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // After the command name, which may hold spaces and parentheses: field 3 on.
    let rest = stat.rsplit_once(')')?.1;
    let mut f = vec![0, 0, 0];
    f.extend(rest.split_whitespace().map(|v| v.parse().unwrap_or(0)));
    Some(f)
}

/// Fork init from this process, which has a single thread ([`single_threaded`]): a child
/// cloned into new namespaces (those of [`spawn_init`]; the network namespace it makes itself,
/// first thing, see [`crate::init`]'s `run`) that runs the
/// sandbox crate's own init code in a copy of this process, with no `execve`. What a cloned
/// and exec'd init costs before it reads its plan (loading the program, the C library's start,
/// which on a virtual machine traps on every `cpuid`, relocations, the Rust runtime's start:
/// about 1.5 ms of CPU on the development VM) is not paid.
///
/// The child starts as an exec'd init does: the control socket on fd 3 and no other
/// descriptor above 2 (this process's close-on-exec ones too, closed explicitly), every
/// signal disposition at its default and the caller's signal mask, the environment `PATH`
/// only (this process's environment strings are zeroed in the copy first, so the user's
/// variables are not in init's memory), and the name `envfactory-init`. It then is init
/// ([`crate::init::main_forked`]), which ends with `_exit`: this process's exit handlers and
/// buffered output are never run or flushed twice. Returns init's pid (in this pid namespace).
pub(crate) fn fork_init(init: &InitProgram, sock: OwnedFd) -> Result<i32, SandboxError> {
    let cmdline = CommandLine::of(init);
    // No CLONE_NEWNET: making a network namespace costs about 0.3 ms in the clone, here, on
    // the engine's path; init makes its own as its first step instead, on the other CPU while
    // the engine resolves the root (`init::run`). Nothing runs in the child before that but
    // this crate's code.
    // SAFETY: the caller runs this only while this process has a single thread
    // (`single_threaded`, checked by `Runtime::create` right before).
    let pid =
        unsafe { fork_into_namespaces(&cmdline, sock.as_raw_fd(), None, 0) }.map_err(|source| {
            SandboxError::Spawn {
                what: "clone into new namespaces",
                source,
            }
        })?;
    drop(sock);
    Ok(pid)
}

/// The fork-like clone of [`fork_init`] and of the init forker (`init_forker.rs`), from this
/// process, which must have a single thread: the child gets `sock_fd` as its control socket,
/// enters `net_fd` (a network namespace made ahead) when given, else makes its own network
/// namespace first thing, and becomes init; `extra_flags` are added to the clone's
/// (`CLONE_PARENT` for the forker). The caller keeps and closes its descriptors. Returns the
/// child's pid.
///
/// # Safety
/// Only while this process has a single thread: the child runs ordinary code (allocation,
/// locks) in its copy, where another thread could have held a lock at the clone.
pub(crate) unsafe fn fork_into_namespaces(
    cmdline: &CommandLine,
    sock_fd: i32,
    net_fd: Option<i32>,
    extra_flags: c_int,
) -> Result<i32, std::io::Error> {
    let flags = libc::CLONE_NEWNS
        | libc::CLONE_NEWPID
        | libc::CLONE_NEWUTS
        | libc::CLONE_NEWIPC
        | libc::SIGCHLD
        | extra_flags;
    let mut mask = 0u64;
    // SAFETY: (whole block) every signal is blocked in this, the only, thread around the
    // clone, so no handler of this process runs in the child before it resets them; the
    // fork-like clone (no CLONE_VM, no stack: the child continues on a copy of this one)
    // returns twice, and the child never returns from `forked_child`.
    unsafe {
        set_mask(&u64::MAX, &mut mask);
        let pid = libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize);
        if pid == 0 {
            forked_child(sock_fd, net_fd.unwrap_or(-1), mask, cmdline);
        }
        let e = std::io::Error::last_os_error();
        set_mask(&mask, std::ptr::null_mut());
        if pid < 0 {
            return Err(e);
        }
        Ok(pid as i32)
    }
}

/// The command line a forked init shows, built before the fork.
pub(crate) struct CommandLine {
    /// The init program's path and arguments, NUL-separated.
    bytes: Vec<u8>,
    /// [`memory_map`] of this process, if known.
    map: Option<MmMap>,
}

impl CommandLine {
    /// An exec'd `init`'s command line, with this process's memory layout.
    pub(crate) fn of(init: &InitProgram) -> Self {
        use std::os::unix::ffi::OsStrExt;
        let mut bytes = init.path.as_os_str().as_bytes().to_vec();
        for a in &init.args {
            bytes.push(0);
            bytes.extend_from_slice(a.as_bytes());
        }
        Self {
            bytes,
            map: memory_map(),
        }
    }
}

/// The forked child of [`fork_into_namespaces`]: becomes init, never returns.
///
/// # Safety
/// Only in that child, with every signal blocked, `sock_fd` the control socket and `net_fd`
/// a network namespace or -1.
unsafe fn forked_child(sock_fd: i32, net_fd: i32, mask: u64, cmdline: &CommandLine) -> ! {
    // SAFETY: (whole block) system calls on descriptors and strings of this process's own
    // copy of memory, in its only thread.
    unsafe {
        // Not dumpable from its first step: a crash before init's own setup leaves no core
        // of the engine's memory.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        // A namespace made ahead is entered before anything else (as `run_child` does); one
        // that cannot be entered ends the child, which the host sees as a dead spare.
        if net_fd >= 0 && crate::netns::enter(net_fd) != 0 {
            libc::_exit(126);
        }
        if sock_fd == crate::init::CONTROL_FD {
            libc::fcntl(sock_fd, libc::F_SETFD, 0);
        } else if libc::dup2(sock_fd, crate::init::CONTROL_FD) < 0 {
            libc::_exit(127);
        }
        close_above_control();
        // SIGSEGV and SIGBUS keep this process's handlers: in a Rust program, the Rust
        // runtime's stack-overflow report on the main thread's alternate stack (copied with
        // it), which an exec'd init installs at its start as well.
        default_dispositions(&[libc::SIGSEGV, libc::SIGBUS]);
        set_mask(&mask, std::ptr::null_mut());
        libc::prctl(libc::PR_SET_NAME, c"envfactory-init".as_ptr(), 0, 0, 0);
        become_init_strings(cmdline);
    }
    crate::init::main_forked(net_fd < 0)
}

/// The kernel's layout of this process's memory that `PR_SET_MM_MAP` takes (fields 26-28 and
/// 45-51 of `/proc/self/stat`: code, stack, data, heap start, argument and environment
/// strings); the heap's end is read where it is set.
fn memory_map() -> Option<MmMap> {
    let f = self_stat()?;
    let n = |i: usize| f.get(i).copied();
    Some(MmMap {
        start_code: n(26)?,
        end_code: n(27)?,
        start_stack: n(28)?,
        start_data: n(45)?,
        end_data: n(46)?,
        start_brk: n(47)?,
        brk: 0,
        arg_start: n(48)?,
        arg_end: n(49)?,
        env_start: n(50)?,
        env_end: n(51)?,
        auxv: 0,
        auxv_size: 0,
        exe_fd: u32::MAX,
    })
}

/// The kernel's `struct prctl_mm_map` (`linux/prctl.h`); an `auxv_size` of 0 leaves the
/// auxiliary vector and an `exe_fd` of -1 the executable as they are.
#[repr(C)]
#[derive(Clone, Copy)]
struct MmMap {
    start_code: u64,
    end_code: u64,
    start_data: u64,
    end_data: u64,
    start_brk: u64,
    brk: u64,
    start_stack: u64,
    arg_start: u64,
    arg_end: u64,
    env_start: u64,
    env_end: u64,
    auxv: u64,
    auxv_size: u32,
    exe_fd: u32,
}

/// `PR_SET_MM_MAP` (`linux/prctl.h`): set the whole layout at once, allowed without
/// CAP_SYS_RESOURCE when the executable stays.
const PR_SET_MM_MAP: libc::c_ulong = 14;

/// Close every descriptor above the control socket: `close_range`, else each one listed in
/// `/proc/self/fd` (not a loop up to the open-file limit, which the runtime raises to the
/// hard limit, up to 2^30).
pub(crate) fn close_above_control() {
    let first = crate::init::CONTROL_FD + 1;
    // SAFETY: closing descriptors this process does not use.
    if unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) } == 0 {
        return;
    }
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .filter(|&fd| fd >= first)
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        // SAFETY: as above (the listing's own descriptor is closed by now).
        unsafe { libc::close(fd) };
    }
}

extern "C" {
    static mut environ: *mut *mut libc::c_char;
}

/// Init's `PATH`, its whole environment.
const INIT_ENV: &std::ffi::CStr = c"PATH=/usr/sbin:/usr/bin:/sbin:/bin";

/// The value of init's `PATH` ([`INIT_ENV`]'s).
pub(crate) fn init_path() -> &'static str {
    INIT_ENV
        .to_str()
        .ok()
        .and_then(|s| s.strip_prefix("PATH="))
        .unwrap_or("/usr/sbin:/usr/bin:/sbin:/bin")
}

/// Make this copy's command line and environment init's: every environment string zeroed
/// (the kernel's copy, variables removed since included, and those set since), then, in the
/// kernel's two areas, the init program's path and arguments (cut if they do not fit) and
/// `PATH` (init's environment when exec'd), each area ended after its new strings
/// (`PR_SET_MM_MAP`; where the kernel refuses it, they end in NULs), so
/// `/proc/<init>/cmdline` and `/proc/<init>/environ` read as for an exec'd init.
///
/// # Safety
/// In the forked child only, single-threaded, with `cmdline.map` from [`memory_map`] of the
/// parent (the same addresses in the copy) and no pointer into the environment held.
unsafe fn become_init_strings(cmdline: &CommandLine) {
    // SAFETY: (whole block) `environ` is the C library's array of NUL-terminated strings,
    // which this process may write (the kernel's copy on the initial stack, or the C
    // library's own allocations), read and changed by this thread only; the two areas are the
    // kernel's copies of argv and the environment, writable memory of the initial stack;
    // `prctl` reads one `MmMap`.
    unsafe {
        let mut p = environ;
        while !p.is_null() && !(*p).is_null() {
            std::ptr::write_bytes(*p, 0, libc::strlen(*p));
            p = p.add(1);
        }
        libc::clearenv();
        // The C library keeps the static string itself as the variable (it never writes it).
        let set_path = || {
            libc::putenv(INIT_ENV.as_ptr().cast_mut());
        };
        let Some(mut map) = cmdline.map else {
            set_path();
            return;
        };
        // Write `bytes` (cut to fit, NUL-terminated) over [start, end), zero the rest; the
        // end of what was written, and whether all of it fitted.
        let fill = |start: u64, end: u64, bytes: &[u8]| -> Option<(u64, bool)> {
            if end <= start {
                return None;
            }
            let len = (end - start) as usize;
            let n = bytes.len().min(len - 1);
            std::ptr::write_bytes(start as *mut u8, 0, len);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), start as *mut u8, n);
            Some((start + n as u64 + 1, n == bytes.len()))
        };
        let args = fill(map.arg_start, map.arg_end, &cmdline.bytes);
        let env = fill(map.env_start, map.env_end, INIT_ENV.to_bytes());
        match env {
            Some((_, true)) => {
                // The environment is that string; the array pointing at it is never freed.
                let array: &'static mut [*mut libc::c_char; 2] = Box::leak(Box::new([
                    map.env_start as *mut libc::c_char,
                    std::ptr::null_mut(),
                ]));
                environ = array.as_mut_ptr();
            }
            _ => set_path(),
        }
        if let Some((end, _)) = args {
            map.arg_end = end;
        }
        if let Some((end, _)) = env {
            map.env_end = end;
        }
        map.brk = libc::sbrk(0) as u64;
        libc::prctl(
            libc::PR_SET_MM,
            PR_SET_MM_MAP,
            &map as *const MmMap,
            std::mem::size_of::<MmMap>() as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
}
