//! Running a command in a fresh sandbox: output, status, hostname, pids.
use crate::common::*;

#[test]
fn runs_a_command_in_a_fresh_sandbox() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let r = sh(
        &mut sb,
        "echo hello; echo err >&2; hostname; id -u; cat /proc/1/comm 2>&1 | head -c 0; exit 3",
    );
    assert_eq!(r.termination, sandbox::Termination::Exited(3), "{r:?}");
    assert_eq!(
        out(&r),
        "hello\nsandbox\n0\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&r.stderr), "err\n", "{r:?}");
    // A fresh pid namespace: init is 1, the zygote that forks commands 2, commands after.
    let r = sh(
        &mut sb,
        "cat /proc/1/cmdline >/dev/null 2>&1; cat /proc/2/comm; ls /proc | grep -c '^[0-9]*$'",
    );
    let o = out(&r);
    assert!(o.starts_with("sandbox-zygote\n"), "{o}");
}

/// The result carries the command's pid in the sandbox (its shell's `$$`), and pids grow from
/// one command to the next.
#[test]
fn results_carry_the_command_pid_in_the_sandbox() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let a = sh(&mut sb, "echo $$");
    assert_eq!(out(&a).trim(), a.pid.to_string(), "{a:?}");
    let b = sh(&mut sb, "echo $$; (true) ; true");
    assert_eq!(out(&b).trim(), b.pid.to_string(), "{b:?}");
    assert!(b.pid > a.pid, "{} then {}", a.pid, b.pid);
}
