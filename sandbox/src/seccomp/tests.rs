//! Unit tests of the seccomp policy: loading, compiling, and filters installed in forked
//! children.

use super::*;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};
use std::ffi::CString;

/// Exit code of a child whose attack unexpectedly succeeded.
const SUCCEEDED: i32 = 0;
/// Exit code of a child whose filter could not be installed.
const APPLY_FAILED: i32 = 200;

fn errno() -> i32 {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(255)
}

/// Forks; the child installs `compiled`, runs `attack` and exits with its result
/// (an errno, or 0 if the syscall succeeded). The test process is never filtered.
fn run_filtered(compiled: &CompiledSeccomp, attack: impl FnOnce() -> i32) -> WaitStatus {
    let prepared = compiled.prepare();
    // SAFETY: the child only installs the filter, runs `attack` (raw syscalls and,
    // for the thread test, thread creation) and leaves with `_exit`.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = match prepared.apply() {
                Ok(()) => attack(),
                Err(_) => APPLY_FAILED,
            };
            // SAFETY: `_exit` ends the child without running the parent's destructors.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => waitpid(child, None).expect("waitpid"),
    }
}

fn embedded_compiled() -> CompiledSeccomp {
    SeccompPolicy::embedded()
        .expect("embedded policy parses")
        .compile()
        .expect("embedded policy compiles")
}

fn assert_exit(status: WaitStatus, expected: i32, what: &str) {
    match status {
        WaitStatus::Exited(_, code) => assert_eq!(code, expected, "{what}: exit code"),
        other => panic!("{what}: unexpected status {other:?}"),
    }
}

/// Result of a raw syscall: 0 on success, else errno.
fn result_of(rc: libc::c_long) -> i32 {
    if rc < 0 {
        errno()
    } else {
        SUCCEEDED
    }
}

fn policy_err(text: &str) -> (usize, String, String) {
    match SeccompPolicy::from_toml(text, "test.toml") {
        Err(SeccompError::Policy {
            file,
            line,
            key,
            reason,
        }) => {
            assert_eq!(file, "test.toml");
            (line, key, reason)
        }
        other => panic!("expected a policy error, got {other:?}"),
    }
}

#[test]
fn embedded_policy_parses_and_every_rule_has_a_why() {
    let policy = SeccompPolicy::embedded().unwrap();
    assert!(!policy.rules().is_empty());
    for rule in policy.rules() {
        assert!(
            !rule.why.trim().is_empty(),
            "{} has an empty why",
            rule.syscall
        );
    }
    let names: Vec<&str> = policy.rules().iter().map(|r| r.syscall.as_str()).collect();
    for required in [
        "mount",
        "umount2",
        "pivot_root",
        "chroot",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
        "init_module",
        "finit_module",
        "delete_module",
        "kexec_load",
        "kexec_file_load",
        "bpf",
        "perf_event_open",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "kcmp",
        "keyctl",
        "add_key",
        "request_key",
        "reboot",
        "swapon",
        "swapoff",
        "clock_settime",
        "clock_adjtime",
        "settimeofday",
        "adjtimex",
        "setns",
        "unshare",
        "clone",
        "clone3",
        "userfaultfd",
        "open_by_handle_at",
        "name_to_handle_at",
        "iopl",
        "ioperm",
        "acct",
        "quotactl",
        "lookup_dcookie",
        "nfsservctl",
        "personality",
        "syslog",
        "vhangup",
        "uselib",
        "ustat",
        "sysfs",
        "_sysctl",
        "pidfd_getfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "fanotify_init",
    ] {
        assert!(names.contains(&required), "policy lacks {required}");
    }
    let clone3 = policy
        .rules()
        .iter()
        .find(|r| r.syscall == "clone3")
        .unwrap();
    assert_eq!(clone3.action, SeccompAction::Errno(libc::ENOSYS));
    let clone_rules = policy
        .rules()
        .iter()
        .filter(|r| r.syscall == "clone")
        .count();
    assert_eq!(clone_rules, 7, "one clone rule per CLONE_NEW* flag");
}

#[test]
fn every_rule_has_a_comment_line_above() {
    let lines: Vec<&str> = EMBEDDED_POLICY.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() == "[[rule]]" {
            assert!(
                i > 0 && lines[i - 1].trim_start().starts_with('#'),
                "line {}",
                i + 1
            );
        }
    }
}

#[test]
fn table_matches_libc_on_this_arch() {
    let arch = std::env::consts::ARCH;
    for (name, nr) in [
        ("mount", libc::SYS_mount),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("bpf", libc::SYS_bpf),
        ("keyctl", libc::SYS_keyctl),
        ("mseal", libc::SYS_mseal),
        ("io_uring_setup", libc::SYS_io_uring_setup),
    ] {
        assert_eq!(syscall_nr(arch, name), Some(nr), "{name}");
    }
}

#[test]
fn unknown_syscall_is_an_error_with_line_and_key() {
    let text = "# c\n[[rule]]\nsyscall = \"mount\"\naction = \"errno\"\nwhy = \"x\"\n\n# c\n[[rule]]\nsyscall = \"no_such_call\"\naction = \"errno\"\nwhy = \"x\"\n";
    let (line, key, reason) = policy_err(text);
    assert_eq!((line, key.as_str()), (9, "syscall"));
    assert!(reason.contains("no_such_call"), "{reason}");
}

#[test]
fn missing_why_is_an_error_with_line_and_key() {
    let text = "[[rule]]\nsyscall = \"mount\"\naction = \"errno\"\nwhy = \"x\"\n\n[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\n";
    let (line, key, reason) = policy_err(text);
    assert_eq!(key, "why");
    assert!((6..=8).contains(&line), "line {line}: {reason}");
    let (_, key, _) = policy_err("[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nwhy = \"  \"\n");
    assert_eq!(key, "why");
}

#[test]
fn bad_action_and_errno_are_errors() {
    let (line, key, reason) =
        policy_err("[[rule]]\nsyscall = \"bpf\"\naction = \"trap\"\nwhy = \"x\"\n");
    assert_eq!((line, key.as_str()), (3, "action"), "{reason}");
    let (line, key, _) = policy_err(
        "[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nerrno = \"EWHAT\"\nwhy = \"x\"\n",
    );
    assert_eq!((line, key.as_str()), (4, "errno"));
    let (_, key, _) = policy_err(
        "[[rule]]\nsyscall = \"bpf\"\naction = \"kill_process\"\nerrno = \"EPERM\"\nwhy = \"x\"\n",
    );
    assert_eq!(key, "errno");
    let (line, key, _) = policy_err(
        "[[rule]]\nsyscall = \"bpf\"\naction = \"errno\"\nwhy = \"x\"\ncolour = \"red\"\n",
    );
    assert_eq!((line, key.as_str()), (5, "colour"));
    let (_, key, _) = policy_err("");
    assert_eq!(key, "rule");
    let (line, key, _) = policy_err("# ok\n[[rule]\n");
    assert_eq!((line, key.as_str()), (2, "(syntax)"));
}

#[test]
fn conflicting_errnos_are_rejected() {
    let text = "[[rule]]\nsyscall = \"clone\"\naction = \"errno\"\nwhy = \"x\"\n[[rule]]\nsyscall = \"clone\"\naction = \"errno\"\nerrno = \"ENOSYS\"\nwhy = \"y\"\n";
    let (line, key, _) = policy_err(text);
    assert_eq!((line, key.as_str()), (6, "errno"));
}

#[test]
fn bad_argument_conditions_are_errors() {
    let (_, key, _) = policy_err(
        "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 6, op = \"eq\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
    );
    assert_eq!(key, "index");
    let (_, key, _) = policy_err(
        "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 0, op = \"masked_eq\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
    );
    assert_eq!(key, "mask");
    let (_, key, _) = policy_err(
        "[[rule]]\nsyscall = \"clone\"\nargs = [{ index = 0, op = \"like\", value = 1 }]\naction = \"errno\"\nwhy = \"x\"\n",
    );
    assert_eq!(key, "op");
}

#[test]
fn compile_produces_programs_for_both_arches() {
    let policy = SeccompPolicy::embedded().unwrap();
    let x86 = policy.compile_for("x86_64").unwrap();
    assert_eq!(x86.programs.len(), 1);
    let arm = policy.compile_for("aarch64").unwrap();
    assert_eq!(arm.programs.len(), 1);
    for program in x86.programs.iter().chain(&arm.programs) {
        assert!(!program.is_empty() && program.len() <= BPF_MAX_INSNS);
        // The program starts with the architecture check.
        assert_eq!(
            program[0],
            (bpf::BPF_LD_W_ABS, 0, 0, bpf::SECCOMP_DATA_ARCH)
        );
    }
    assert!(matches!(
        policy.compile_for("mips"),
        Err(SeccompError::UnsupportedArch { .. })
    ));
    let empty = CompiledSeccomp { programs: vec![] };
    assert!(matches!(empty.apply(), Err(SeccompError::NoPrograms)));
    assert!(matches!(
        empty.prepare().apply(),
        Err(SeccompError::NoPrograms)
    ));
    let json = serde_json::to_string(&x86).unwrap();
    let back: CompiledSeccomp = serde_json::from_str(&json).unwrap();
    assert_eq!(back, x86);
}

#[test]
fn mount_is_eperm() {
    let compiled = embedded_compiled();
    let status = run_filtered(&compiled, || {
        // Without the filter this fails with ENOENT (no such target), never mounts.
        // SAFETY: valid NUL-terminated strings and a null data pointer.
        let rc = unsafe {
            libc::mount(
                c"none".as_ptr(),
                c"/nonexistent-envfactory-target".as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        result_of(rc.into())
    });
    assert_exit(status, libc::EPERM, "mount");
}

#[test]
fn unshare_newuser_is_eperm() {
    let compiled = embedded_compiled();
    let status = run_filtered(&compiled, || {
        raw(
            libc::SYS_unshare,
            [libc::c_long::from(libc::CLONE_NEWUSER), 0, 0, 0],
        )
    });
    assert_exit(status, libc::EPERM, "unshare(CLONE_NEWUSER)");
}

/// Raw syscall for the attack tests: 0 on success, else errno. Callers pass
/// integers, null pointers or pointers to static NUL-terminated strings.
fn raw(nr: libc::c_long, args: [libc::c_long; 4]) -> i32 {
    // SAFETY: see above; the kernel validates every pointer it is given.
    result_of(unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3]) })
}

/// Raw clone(2) with `flags` and no new stack (fork semantics).
fn raw_clone(flags: libc::c_long) -> i32 {
    // SAFETY: clone without CLONE_VM and with a null stack behaves like fork; the
    // grandchild leaves immediately with `_exit`.
    let rc = unsafe { libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) };
    if rc == 0 {
        // SAFETY: leave the grandchild at once.
        unsafe { libc::_exit(0) }
    }
    if rc > 0 {
        let _ = waitpid(nix::unistd::Pid::from_raw(rc as i32), None);
        return SUCCEEDED;
    }
    errno()
}

#[test]
fn clone_newns_is_eperm_and_plain_fork_works() {
    let compiled = embedded_compiled();
    let flags = libc::c_long::from(libc::CLONE_NEWNS | libc::SIGCHLD);
    let status = run_filtered(&compiled, || raw_clone(flags));
    assert_exit(status, libc::EPERM, "clone(CLONE_NEWNS)");
    let status = run_filtered(&compiled, || raw_clone(libc::c_long::from(libc::SIGCHLD)));
    assert_exit(status, SUCCEEDED, "clone(SIGCHLD)");
    let status = run_filtered(&compiled, || {
        // SAFETY: plain fork; the grandchild exits at once with a known code.
        match unsafe { libc::fork() } {
            // SAFETY: leave the grandchild at once.
            0 => unsafe { libc::_exit(7) },
            -1 => errno(),
            pid => match waitpid(nix::unistd::Pid::from_raw(pid), None) {
                Ok(WaitStatus::Exited(_, 7)) => SUCCEEDED,
                _ => 101,
            },
        }
    });
    assert_exit(status, SUCCEEDED, "fork");
}

#[test]
fn clone3_is_enosys_and_threads_work() {
    let compiled = embedded_compiled();
    let status = run_filtered(&compiled, || {
        // struct clone_args, 88 bytes (CLONE_ARGS_SIZE_VER2); exit_signal = SIGCHLD.
        let mut args = [0u64; 11];
        args[4] = libc::SIGCHLD as u64;
        // SAFETY: `args` is a valid clone_args of the size passed; if the call
        // succeeded the grandchild would leave at once.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                args.as_mut_ptr(),
                std::mem::size_of_val(&args),
            )
        };
        if rc == 0 {
            // SAFETY: leave the grandchild at once.
            unsafe { libc::_exit(0) }
        }
        result_of(rc)
    });
    assert_exit(status, libc::ENOSYS, "clone3");
    let status = run_filtered(&compiled, || match std::thread::spawn(|| 42).join() {
        Ok(42) => SUCCEEDED,
        _ => 102,
    });
    assert_exit(status, SUCCEEDED, "std::thread::spawn");
}

#[test]
fn ptrace_keyctl_reboot_bpf_init_module_are_eperm() {
    let compiled = embedded_compiled();
    let status = run_filtered(&compiled, || {
        raw(
            libc::SYS_ptrace,
            [libc::c_long::from(libc::PTRACE_TRACEME), 0, 0, 0],
        )
    });
    assert_exit(status, libc::EPERM, "ptrace(PTRACE_TRACEME)");
    // KEYCTL_GET_KEYRING_ID (0) of KEY_SPEC_SESSION_KEYRING (-3), no create.
    let status = run_filtered(&compiled, || raw(libc::SYS_keyctl, [0, -3, 0, 0]));
    assert_exit(status, libc::EPERM, "keyctl");
    // Bad magic numbers: without the filter, EINVAL (never reboots).
    let status = run_filtered(&compiled, || raw(libc::SYS_reboot, [0, 0, 0, 0]));
    assert_exit(status, libc::EPERM, "reboot");
    // BPF_MAP_CREATE with a null attr: without the filter, EINVAL/EFAULT.
    let status = run_filtered(&compiled, || raw(libc::SYS_bpf, [0, 0, 0, 0]));
    assert_exit(status, libc::EPERM, "bpf");
    // Null image: without the filter, EFAULT/ENOEXEC (never loads anything).
    let status = run_filtered(&compiled, || {
        raw(
            libc::SYS_init_module,
            [0, 0, c"".as_ptr() as libc::c_long, 0],
        )
    });
    assert_exit(status, libc::EPERM, "init_module");
}

#[test]
fn kill_process_action_kills_with_sigsys() {
    let policy = SeccompPolicy::from_toml(
        "# test\n[[rule]]\nsyscall = \"getppid\"\naction = \"kill_process\"\nwhy = \"test\"\n",
        "kill.toml",
    )
    .unwrap();
    let compiled = policy.compile().unwrap();
    let status = run_filtered(&compiled, || raw(libc::SYS_getppid, [0, 0, 0, 0]));
    assert!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
        "{status:?}"
    );
}

#[cfg(target_arch = "x86_64")]
#[test]
fn x32_syscall_numbers_are_killed() {
    let compiled = embedded_compiled();
    // x32 getpid: 0x40000000 | 39.
    let status = run_filtered(&compiled, || {
        raw(0x4000_0000 | libc::SYS_getpid, [0, 0, 0, 0])
    });
    assert!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
        "{status:?}"
    );
}

/// i386 `getpid` through `int 0x80` (audit arch AUDIT_ARCH_I386).
#[cfg(target_arch = "x86_64")]
fn int80_getpid() -> i32 {
    let mut eax: u32 = 20;
    // SAFETY: the 32-bit getpid syscall takes no arguments and touches no memory;
    // the registers the kernel may clobber are declared.
    unsafe {
        std::arch::asm!(
            "int 0x80",
            inout("eax") eax,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            options(nostack)
        );
    }
    i32::from(eax == 0)
}

#[cfg(target_arch = "x86_64")]
#[test]
fn foreign_architecture_syscalls_are_killed() {
    // Unfiltered: the kernel must support the i386 ABI, else there is nothing to test.
    // SAFETY: the child makes one syscall and leaves with `_exit`.
    let unfiltered = match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            let code = int80_getpid();
            // SAFETY: leave the child.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => waitpid(child, None).expect("waitpid"),
    };
    if !matches!(unfiltered, WaitStatus::Exited(_, 0)) {
        eprintln!("no i386 syscall ABI here ({unfiltered:?}); skipped");
        return;
    }
    let status = run_filtered(&embedded_compiled(), int80_getpid);
    assert!(
        matches!(status, WaitStatus::Signaled(_, Signal::SIGSYS, _)),
        "{status:?}"
    );
}

fn exec_sh(script: &str) -> (WaitStatus, String) {
    let compiled = embedded_compiled();
    let (read_end, write_end) = nix::unistd::pipe().expect("pipe");
    let sh = CString::new("/bin/sh").unwrap();
    let argv = [
        CString::new("sh").unwrap(),
        CString::new("-c").unwrap(),
        CString::new(script).unwrap(),
    ];
    let prepared = compiled.prepare();
    // SAFETY: the child only redirects stdout, installs the filter and execs.
    match unsafe { fork() }.expect("fork") {
        ForkResult::Child => {
            drop(read_end);
            // SAFETY: dup2 of a valid descriptor onto stdout.
            unsafe { libc::dup2(std::os::fd::AsRawFd::as_raw_fd(&write_end), 1) };
            if prepared.apply().is_err() {
                // SAFETY: leave the child.
                unsafe { libc::_exit(APPLY_FAILED) }
            }
            let _ = nix::unistd::execv(&sh, &argv);
            // SAFETY: leave the child if exec failed.
            unsafe { libc::_exit(127) }
        }
        ForkResult::Parent { child } => {
            drop(write_end);
            let mut out = String::new();
            let mut file = std::fs::File::from(read_end);
            std::io::Read::read_to_string(&mut file, &mut out).expect("read");
            (waitpid(child, None).expect("waitpid"), out)
        }
    }
}

#[test]
fn exec_sh_true_works_after_filter() {
    let (status, _) = exec_sh("true");
    assert_exit(status, 0, "sh -c true");
}

#[test]
fn shell_pipeline_works_after_filter() {
    let (status, out) = exec_sh("echo hi | cat");
    assert_exit(status, 0, "sh -c 'echo hi | cat'");
    assert_eq!(out, "hi\n");
}

#[test]
fn the_remembered_program_is_the_compiled_one_and_a_bad_entry_is_replaced() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("digests");
    let fresh = embedded_compiled();
    assert_eq!(super::embedded_compiled(&dir).unwrap(), fresh);
    let entry = dir.join(format!("seccomp-{}.json", std::env::consts::ARCH));
    let written = std::fs::read(&entry).unwrap();
    assert_eq!(super::embedded_compiled(&dir).unwrap(), fresh, "read back");
    // A torn entry, an entry under another key and a world-writable entry are not used.
    let allow_all = CompiledSeccomp {
        programs: vec![vec![(bpf::BPF_RET_K, 0, 0, bpf::RET_ALLOW)]],
    };
    let key_line =
        String::from_utf8_lossy(&written[..written.iter().position(|b| *b == b'\n').unwrap() + 1])
            .into_owned();
    let forged = |header: &str, mode: u32| {
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend(serde_json::to_vec(&allow_all).unwrap());
        std::fs::write(&entry, bytes).unwrap();
        std::fs::set_permissions(&entry, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    forged("envfactory-cache-v1 0000\n", 0o600);
    assert_eq!(
        super::embedded_compiled(&dir).unwrap(),
        fresh,
        "another key"
    );
    forged(&key_line, 0o666);
    assert_eq!(
        super::embedded_compiled(&dir).unwrap(),
        fresh,
        "world-writable"
    );
    std::fs::write(&entry, &written[..written.len() / 2]).unwrap();
    assert_eq!(super::embedded_compiled(&dir).unwrap(), fresh, "torn");
    assert_eq!(std::fs::read(&entry).unwrap(), written, "rewritten");
}
