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

/// A request may name the user to run as: the switch happens in the sandbox before `execve`
/// (no program of the root filesystem is trusted with it), with no supplementary groups and no
/// capabilities left; the next command is root again.
#[test]
fn a_command_can_run_as_another_user_without_capabilities() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    sh(
        &mut sb,
        "echo secret > /root/only-root; chmod 600 /root/only-root",
    );
    let mut req = sandbox::ExecRequest::shell(
        "id -u; id -g; id -G; grep -E '^Cap(Inh|Prm|Eff|Amb)' /proc/self/status; \
         cat /root/only-root 2>&1 || echo denied",
    );
    req.cwd = "/".into();
    req.user = Some((65534, 65534));
    let r = sb.exec(&req).unwrap();
    let o = out(&r);
    let lines: Vec<&str> = o.lines().collect();
    assert_eq!(&lines[..3], ["65534", "65534", "65534"], "{o}");
    for cap in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        let line = lines.iter().find(|l| l.starts_with(cap)).unwrap();
        assert!(line.ends_with("0000000000000000"), "{line}");
    }
    assert!(
        o.contains("Permission denied") && o.ends_with("denied\n"),
        "{o}"
    );
    assert_eq!(out(&sh(&mut sb, "id -u")), "0\n");
}

/// Init is cloned with every signal blocked in the creating thread (`spawn_init.rs`), and the
/// thread that creates a sandbox may itself block or ignore signals: commands still start with
/// no signal blocked and none ignored, and a signal's default action still applies to them.
#[test]
fn commands_start_with_no_signal_blocked_or_ignored() {
    require_root!();
    let rt = runtime();
    // SAFETY: sets owned here; only this test's thread's mask changes, restored below.
    let old = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    };
    let made = rt.create(&config());
    // SAFETY: restoring the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    let mut sb = made.unwrap();
    let r = sh(&mut sb, "grep -E '^Sig(Blk|Ign)' /proc/self/status");
    assert_eq!(
        out(&r),
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
        "{r:?}"
    );
    let r = sh(&mut sb, "kill -USR1 $$; echo survived");
    assert_eq!(
        r.termination,
        sandbox::Termination::Signaled(libc::SIGUSR1),
        "{r:?}"
    );
}

/// An init program that exists but cannot be executed is a clear error naming it and the
/// reason (the child reports `execve`'s errno before it exits), not a later socket error;
/// nothing of the failed sandbox is left, and the runtime goes on making sandboxes.
#[test]
fn an_init_program_that_cannot_be_executed_is_named_with_the_reason() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("not-an-init");
    std::fs::write(&bad, "no exec bit\n").unwrap();
    let rt = {
        let _starting = serial(&RUNTIME_START);
        sandbox::testing::runtime_with(sandbox::InitProgram::at(bad.clone(), vec![]).unwrap())
    };
    for _ in 0..2 {
        let e = rt.create(&config()).map(|_| ()).unwrap_err().to_string();
        assert!(
            e.contains(&bad.display().to_string()) && e.contains("Permission denied"),
            "{e}"
        );
    }
    let good = runtime();
    let mut sb = good.create(&config()).unwrap();
    assert_eq!(out(&sh(&mut sb, "echo up")), "up\n");
}

/// Looks ride on a command: each is answered after the command has ended (its file is there),
/// exactly as its own request would be right after; a command with too many is refused before
/// it runs.
#[test]
fn looks_after_a_command_are_answered_as_their_own_requests_would_be() {
    use sandbox::protocol::{Look, Response, MAX_LOOKS};
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let looks = vec![
        Look::ReadFile {
            path: "/root/made".into(),
            max_bytes: 3,
            nofollow: true,
        },
        Look::Stat {
            path: "/root/made".into(),
        },
        Look::ListDir {
            path: "/root".into(),
        },
        Look::Overview {
            path: "/root".into(),
            max_entries: 10,
        },
        Look::ReadFile {
            path: "/root/absent".into(),
            max_bytes: 10,
            nofollow: false,
        },
        Look::Health,
    ];
    let mut req = sandbox::ExecRequest::shell("printf hello > /root/made; mkdir /root/d");
    req.looks = looks.clone();
    let r = sb.exec(&req).unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.answers.len(), looks.len(), "{r:?}");
    let (data, cut) = sandbox::sandbox::file_answer(r.answers[0].clone()).unwrap();
    assert_eq!((data.as_slice(), cut), (&b"hel"[..], true));
    // Each look asked alone now, its answer put back in the response it came as.
    let own = asked_alone(&mut sb, &looks);
    same_answers(&r.answers, &own, &looks);
    assert!(
        matches!(r.answers[4], Response::Failed { .. }),
        "{:?}",
        r.answers[4]
    );
    let mut too_many = sandbox::ExecRequest::shell("touch /root/ran");
    too_many.looks = vec![Look::Health; MAX_LOOKS + 1];
    let e = sb.exec(&too_many).unwrap_err().to_string();
    assert!(e.contains("at most 16"), "{e}");
    assert!(sb.stat("/root/ran").is_err(), "the command did not run");
}

/// Each look asked alone, its answer put back in the response it comes as in a reply.
fn asked_alone(
    sb: &mut sandbox::Sandbox,
    looks: &[sandbox::protocol::Look],
) -> Vec<sandbox::protocol::Response> {
    use sandbox::protocol::{Look, Response};
    fn back<T>(r: Result<T, sandbox::SandboxError>, ok: impl FnOnce(T) -> Response) -> Response {
        match r {
            Ok(v) => ok(v),
            Err(sandbox::SandboxError::Request { kind, message }) => {
                Response::Failed { kind, message }
            }
            Err(e) => panic!("{e}"),
        }
    }
    let file = |(data, truncated)| Response::File { data, truncated };
    looks
        .iter()
        .map(|l| match l {
            Look::ReadFile {
                path,
                max_bytes,
                nofollow: true,
            } => back(sb.read_file_nofollow(path, *max_bytes), file),
            Look::ReadFile {
                path, max_bytes, ..
            } => back(sb.read_file(path, *max_bytes), file),
            Look::Stat { path } => back(sb.stat(path), Response::Stat),
            Look::ListDir { path } => back(sb.list_dir(path), Response::Dir),
            Look::Overview { path, max_entries } => {
                back(sb.overview(path, *max_entries), Response::Overview)
            }
            Look::Health => back(sb.health(), Response::Health),
        })
        .collect()
}

/// The answers that came with a request equal those asked alone (health: what no command
/// changes; its counts are of the moment).
fn same_answers(
    with: &[sandbox::protocol::Response],
    alone: &[sandbox::protocol::Response],
    looks: &[sandbox::protocol::Look],
) {
    use sandbox::protocol::Response;
    assert_eq!(with.len(), alone.len());
    for (i, (with, alone)) in with.iter().zip(alone).enumerate() {
        match (with, alone) {
            (Response::Health(a), Response::Health(b)) => assert_eq!(
                (a.upper_bytes, a.snapshots, a.zygote_pid),
                (b.upper_bytes, b.snapshots, b.zygote_pid)
            ),
            _ => assert_eq!(with, alone, "look {i}: {:?}", looks[i]),
        }
    }
}

/// Looks ride on a reset: each is answered on the fresh state, exactly as its own request
/// would be right after; too many are refused before the reset.
#[test]
fn looks_with_a_reset_are_answered_on_the_fresh_state() {
    use sandbox::protocol::{Look, Response, MAX_LOOKS};
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let made = sb
        .exec(&sandbox::ExecRequest::shell(
            "printf hello > /root/made; mkdir /root/d; echo changed-by-the-command >> /etc/passwd",
        ))
        .unwrap();
    assert!(made.success(), "{made:?}");
    let looks = vec![
        Look::ReadFile {
            path: "/root/made".into(),
            max_bytes: 10,
            nofollow: true,
        },
        Look::Stat {
            path: "/root/d".into(),
        },
        Look::ListDir {
            path: "/root".into(),
        },
        Look::Overview {
            path: "/root".into(),
            max_entries: 10,
        },
        Look::ReadFile {
            path: "/etc/passwd".into(),
            max_bytes: 1 << 20,
            nofollow: false,
        },
        Look::Health,
    ];
    let answers = sb.reset_and_look(&looks).unwrap();
    assert_eq!(answers.len(), looks.len(), "{answers:?}");
    // What the command made is gone in the answers themselves.
    assert!(
        matches!(answers[0], Response::Failed { .. }),
        "{:?}",
        answers[0]
    );
    assert!(
        matches!(answers[1], Response::Failed { .. }),
        "{:?}",
        answers[1]
    );
    let (passwd, _) = sandbox::sandbox::file_answer(answers[4].clone()).unwrap();
    let passwd = String::from_utf8_lossy(&passwd);
    assert!(passwd.contains("root:"), "{passwd}");
    assert!(!passwd.contains("changed-by-the-command"), "{passwd}");
    same_answers(&answers, &asked_alone(&mut sb, &looks), &looks);
    // Too many looks are refused before the reset.
    assert!(sb
        .exec(&sandbox::ExecRequest::shell("touch /root/kept"))
        .unwrap()
        .success());
    let e = sb
        .reset_and_look(&vec![Look::Health; MAX_LOOKS + 1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("at most 16"), "{e}");
    assert!(sb.stat("/root/kept").is_ok(), "not reset");
    // No looks: a plain reset.
    assert!(sb.reset_and_look(&[]).unwrap().is_empty());
    assert!(sb.stat("/root/kept").is_err(), "reset");
}
