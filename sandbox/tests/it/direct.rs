//! Shell commands that need no shell run as argv (`sandbox/src/init/direct.rs`): for every
//! command of a table, the result (how it ended, stdout, stderr) is the same as that of
//! `/bin/sh -c` with the same command, environment and working directory.

use crate::common::{config, out, require_root, runtime, sh};
use sandbox::{ExecRequest, ExecResult};

fn both(sb: &mut sandbox::Sandbox, cmd: &str, env: Option<&[&str]>, cwd: &str) {
    let with = |mut r: ExecRequest| {
        r.cwd = cwd.into();
        r.env = env.map(|e| e.iter().map(|s| s.to_string()).collect());
        r
    };
    let direct = sb.exec(&with(ExecRequest::shell(cmd))).unwrap();
    let shell = sb
        .exec(&with(ExecRequest::argv(["/bin/sh", "-c", cmd])))
        .unwrap();
    let show = |r: &ExecResult| {
        (
            r.termination,
            String::from_utf8_lossy(&r.stdout).into_owned(),
            String::from_utf8_lossy(&r.stderr).into_owned(),
        )
    };
    assert_eq!(show(&direct), show(&shell), "{cmd:?} env {env:?} in {cwd}");
}

#[test]
fn plain_commands_give_what_the_shell_gives() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let setup = "mkdir -p /tmp/a /tmp/b /tmp/dir/ls && \
        printf 'echo from a script without #!\\nexit 7\\n' > /tmp/noshebang && chmod +x /tmp/noshebang && \
        printf '#!/nonexistent/interp\\n' > /tmp/badinterp && chmod +x /tmp/badinterp && \
        printf 'x' > /tmp/a/cat && printf '#!/bin/sh\\necho b-prog \"$@\"\\n' > /tmp/b/prog && chmod +x /tmp/b/prog && \
        printf 'import os, sys\\nsys.stdout.write(\"out\\\\n\"); sys.stdout.flush()\\nos.kill(os.getpid(), int(sys.argv[1]))\\n' > /tmp/die.py && \
        ln -s /tmp /tmp/link && echo ok";
    assert_eq!(out(&sh(&mut sb, setup)), "ok\n");
    let table = [
        "ls /",
        "ls -la /etc/hostname",
        "cat /etc/hostname",
        "ls /nonexistent",
        "env",
        "printenv PATH",
        "nonexistent-command",
        "nonexistent-command with args",
        "/nonexistent/path",
        "/etc/hostname",
        "/tmp/noshebang",
        "/tmp/badinterp",
        "/tmp",
        "ls=1",
        "grep -c root /etc/passwd",
        "head -c 3 /etc/hostname",
        "python3 /tmp/die.py 9",
        "python3 /tmp/die.py 11",
        "python3 /tmp/die.py 15",
        "python3 /tmp/die.py 13",
        "python3 /tmp/die.py 2",
        "python3 /tmp/die.py 6",
        "sleep 0.01",
        "wc -l /etc/passwd /etc/group",
        "dd if=/dev/zero bs=1 count=3 status=none",
        "/bin/pwd",
        "true",
        "echo -e x",
    ];
    for cmd in table {
        both(&mut sb, cmd, None, "/root");
    }
    // The environment (dash's order, its PWD) and the PATH search.
    let envs: [&[&str]; 6] = [
        &["PATH=/usr/bin:/bin", "B=1", "A=2", "ZZ=3"],
        &["PATH=/usr/bin:/bin", "PWD=/wrong"],
        &["PATH=/usr/bin:/bin", "PWD=/tmp/link"],
        &["PATH=/usr/bin:/bin", "PWD=/tmp"],
        &[
            "PATH=/tmp/a:/tmp/b::/usr/bin",
            "HOME=/x",
            "PS1=u",
            "MAIL=m",
            "TERM=dumb",
        ],
        &["PATH=/tmp/dir:/usr/bin", "LANG=C.UTF-8", "LC_ALL=C"],
    ];
    for env in envs {
        for cmd in [
            "env",
            "/usr/bin/env",
            "prog x y",
            "cat /etc/hostname",
            "ls /tmp/a",
        ] {
            both(&mut sb, cmd, Some(env), "/tmp");
        }
    }
    // A program in the working directory through an empty PATH entry.
    both(
        &mut sb,
        "prog z",
        Some(&["PATH=/nonexistent::/usr/bin"]),
        "/tmp/b",
    );
    // Stdin reaches the command.
    let mut r = ExecRequest::shell("wc -c");
    r.stdin = b"12345".to_vec();
    assert_eq!(out(&sb.exec(&r).unwrap()).trim(), "5");
}

#[test]
fn plain_commands_run_without_a_shell_process() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    // The command's parent is init itself: no `sh` in between.
    let ppid = |sb: &mut sandbox::Sandbox, cmd: &str| {
        let o = out(&sh(sb, cmd));
        let rest = o.rsplit_once(')').unwrap().1.to_string();
        rest.split_whitespace().nth(1).unwrap().to_string()
    };
    assert_eq!(ppid(&mut sb, "cat /proc/self/stat"), "1");
    // With anything the shell must interpret, the shell runs it.
    assert_ne!(ppid(&mut sb, "cat /proc/self/stat | cat"), "1");
    // A root whose /bin/sh is not its dash: the shell always runs it.
    let replace = "rm -f /bin/sh && cp /bin/dash /bin/sh && echo replaced";
    assert_eq!(out(&sh(&mut sb, replace)), "replaced\n");
    assert_ne!(ppid(&mut sb, "cat /proc/self/stat"), "1");
}

#[test]
fn a_shell_epilogue_runs_only_when_the_shell_does() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let run = |sb: &mut sandbox::Sandbox, cmd: &str| {
        let mut r = ExecRequest::shell(cmd);
        r.cwd = "/tmp".into();
        r.shell_epilogue = Some("rc=$?; echo \"epilogue $PWD\" >&2; exit $rc".into());
        sb.exec(&r).unwrap()
    };
    let err = |r: &ExecResult| String::from_utf8_lossy(&r.stderr).into_owned();
    // Run as its words: no shell, so no epilogue, and the status is the command's own.
    let r = run(&mut sb, "ls /nonexistent");
    assert_eq!(r.termination, sandbox::Termination::Exited(2));
    assert!(!err(&r).contains("epilogue"), "{}", err(&r));
    // Through the shell, the epilogue sees the shell's state after the command and keeps its
    // status; a trailing comment does not swallow it.
    let r = run(&mut sb, "cd / && ls /nonexistent # comment");
    assert_eq!(r.termination, sandbox::Termination::Exited(2));
    assert!(err(&r).ends_with("epilogue /\n"), "{}", err(&r));
    // A program that cannot run falls back to the shell without the epilogue (no shell state
    // could have changed): dash's status and message.
    let r = run(&mut sb, "nonexistent-command");
    assert_eq!(r.termination, sandbox::Termination::Exited(127));
    assert!(!err(&r).contains("epilogue"), "{}", err(&r));
    // When /bin/sh is not the root's dash, every shell command takes the shell and its epilogue.
    let replace = "rm -f /bin/sh && cp /bin/dash /bin/sh && echo replaced";
    assert_eq!(out(&sh(&mut sb, replace)), "replaced\n");
    let r = run(&mut sb, "ls /nonexistent");
    assert_eq!(r.termination, sandbox::Termination::Exited(2));
    assert!(err(&r).ends_with("epilogue /tmp\n"), "{}", err(&r));
}
