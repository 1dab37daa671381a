//! Starting one command from the zygote the way `posix_spawn` does: the child is cloned with
//! `CLONE_VM | CLONE_VFORK` onto a stack of its own, so no page table is copied and none torn
//! down again at `execve` (a `fork` of the zygote cost about a fifth of a whole step). The
//! zygote waits, suspended by the kernel, until the child has exec'd or exited.
//!
//! The child shares the zygote's memory until `execve`, so everything it touches is built
//! before the clone ([`Plan`]): it only makes raw system calls, never allocates, never takes
//! a lock, never unwinds. Its first act is to write its pid on the status pipe, which only
//! init reads: init learns which process it started even if the command kills the zygote
//! before the zygote's own answer (see `exec.rs`). Then, as before: a session of its own,
//! stdio, everything else close-on-exec, the requested user, the working directory, `execve`;
//! a failure before `execve` writes its stage and errno on the status pipe and exits 127.

use super::zygote::{Stage, SHELL_AFTER_ALL};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::fd::RawFd;

/// The child's stack: it runs only the code below (no recursion, no large locals).
pub(super) const STACK_SIZE: usize = 256 << 10;

/// A stack for the child, with a guard page below it; reused by every spawn of one zygote
/// (the zygote is suspended while the child uses it).
pub(crate) struct Stack {
    base: *mut c_void,
    len: usize,
}

impl Stack {
    pub(crate) fn new() -> Result<Self, i32> {
        let page = 4096;
        let len = STACK_SIZE + page;
        // SAFETY: an anonymous private mapping of our own; the guard page is made inaccessible.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return Err(errno());
            }
            if libc::mprotect(base, page, libc::PROT_NONE) != 0 {
                let e = errno();
                libc::munmap(base, len);
                return Err(e);
            }
            Ok(Self { base, len })
        }
    }

    /// The highest address, 16-byte aligned (stacks grow down on x86_64 and aarch64).
    pub(crate) fn top(&self) -> *mut c_void {
        let end = self.base as usize + self.len;
        (end & !15) as *mut c_void
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`; no child runs on it any more.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// A NUL-terminated array of pointers into `strings` (which must outlive it).
pub(crate) fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// Everything the child reads, built before the clone.
pub(super) struct Plan<'a> {
    /// stdin, stdout, stderr, status pipe.
    pub fds: [RawFd; 4],
    pub user: Option<(u32, u32)>,
    pub cwd: &'a CStr,
    /// Paths to try for `argv[0]`, in order.
    pub programs: &'a [CString],
    pub argv: &'a [*const c_char],
    pub env: &'a [*const c_char],
    /// For a shell command run as its words: dash's environment for the words (`None` when
    /// it could not be made: the shell runs at once), and `/bin/sh -c COMMAND`'s argv.
    pub shell: Option<(Option<&'a [*const c_char]>, &'a [*const c_char])>,
}

/// Clone the command as a child of init (`CLONE_PARENT`) on `stack`; returns its pid, or
/// -errno. When this returns, the child has exec'd or exited.
pub(super) fn spawn(plan: &Plan<'_>, stack: &Stack) -> i32 {
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT | libc::SIGCHLD;
    // SAFETY: `child` runs on its own stack in our memory and only reads `plan`, which lives
    // across the call (the kernel keeps us suspended until the child execs or exits); it makes
    // raw system calls only and never returns into our frames.
    let pid = unsafe {
        libc::clone(
            child,
            stack.top(),
            flags,
            (plan as *const Plan<'_>).cast_mut().cast(),
        )
    };
    if pid < 0 {
        -errno()
    } else {
        pid
    }
}

fn errno() -> i32 {
    nix::errno::Errno::last_raw()
}

/// Write all of `bytes` to `fd` (a pipe with room: the status pipe holds at most 8 bytes).
fn put(fd: RawFd, bytes: &[u8]) {
    // SAFETY: writing a buffer we own to a descriptor we hold.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
}

/// Report where the child failed and leave without unwinding.
fn fail(status: RawFd, stage: Stage, e: i32) -> ! {
    put(
        status,
        &[stage as u8, (e & 0xff) as u8, ((e >> 8) & 0xff) as u8],
    );
    // SAFETY: leaving the child at once.
    unsafe { libc::_exit(127) }
}

/// The child, on its own stack, in the zygote's memory: raw system calls only.
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Plan` that `spawn` passed, alive until we exec or exit.
    let plan = unsafe { &*(arg as *const Plan<'_>) };
    let status = plan.fds[3];
    // SAFETY: (whole block) raw system calls on descriptors and strings the plan holds. The
    // credential calls go straight to the kernel: the C library's wrappers would try to
    // synchronise threads of what it believes is the zygote.
    unsafe {
        let pid = libc::syscall(libc::SYS_getpid) as i32;
        put(status, &pid.to_le_bytes());
        libc::setsid();
        libc::dup2(plan.fds[0], 0);
        libc::dup2(plan.fds[1], 1);
        libc::dup2(plan.fds[2], 2);
        // Everything else closes on exec (the status pipe reports exec failure only).
        libc::syscall(
            libc::SYS_close_range,
            3u32,
            u32::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if let Some((uid, gid)) = plan.user {
            // Groups first, then the gid, then the uid (after which none can change): leaving
            // uid 0 clears the permitted, effective and ambient capabilities.
            if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
                // The inheritable set survives a uid change: empty it too, so no file with
                // inheritable capabilities can hand any back.
                || crate::caps::capset([0, 0]) != 0
            {
                fail(status, Stage::User, errno());
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            fail(status, Stage::Chdir, errno());
        }
    }
    if let Some((direct_env, sh)) = plan.shell {
        // Without the shell: dash's environment, dash's PATH search; anything that does not
        // exec goes to the shell itself (statuses, messages, ENOEXEC).
        if let Some(denv) = direct_env {
            for prog in plan.programs {
                // SAFETY: NUL-terminated arrays of valid C strings that live across the call.
                unsafe { libc::execve(prog.as_ptr(), plan.argv.as_ptr(), denv.as_ptr()) };
                if !matches!(errno(), libc::ENOENT | libc::ENOTDIR) {
                    break;
                }
            }
        }
        // One byte on the status pipe: the shell runs this command after all (init then
        // reports its result as it is).
        put(status, &[SHELL_AFTER_ALL]);
        // SAFETY: as above.
        unsafe { libc::execve(c"/bin/sh".as_ptr(), sh.as_ptr(), plan.env.as_ptr()) };
        fail(status, Stage::Exec, errno())
    }
    let mut last = libc::ENOENT;
    for prog in plan.programs {
        // SAFETY: NUL-terminated arrays of valid C strings that live across the call.
        unsafe { libc::execve(prog.as_ptr(), plan.argv.as_ptr(), plan.env.as_ptr()) };
        last = errno();
        if last != libc::ENOENT && last != libc::ENOTDIR {
            break;
        }
    }
    fail(status, Stage::Exec, last)
}
/// Program paths to try, as `execvp` would, from the command's own `PATH`.
pub(super) fn candidates(arg0: &str, env: &[String]) -> Vec<CString> {
    if arg0.contains('/') {
        return CString::new(arg0).into_iter().collect();
    }
    let path = env
        .iter()
        .find_map(|kv| kv.strip_prefix("PATH="))
        .unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':')
        .map(|d| if d.is_empty() { "." } else { d })
        .filter_map(|d| CString::new(format!("{d}/{arg0}")).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_candidates_follow_path() {
        let env = vec!["PATH=/a::/b".to_string()];
        let c: Vec<String> = candidates("ls", &env)
            .into_iter()
            .map(|c| c.into_string().unwrap())
            .collect();
        assert_eq!(c, vec!["/a/ls", "./ls", "/b/ls"]);
        assert_eq!(candidates("/bin/x", &env).len(), 1);
    }
}
