//! The attack battery: each attack is contained and reported clearly, and the host and other
//! sandboxes stay untouched. Runs as root (CI runs as root).
use crate::common::*;
use sandbox::{ExecRequest, Termination};

fn small() -> sandbox::SandboxConfig {
    let mut c = config();
    c.limits.memory_bytes = 64 << 20;
    c.limits.pids = 64;
    c.disk_bytes = 16 << 20;
    c
}

#[test]
fn fork_bomb_is_contained_by_the_pids_limit_and_timeout() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let mut req = ExecRequest::shell("bomb() { bomb | bomb & }; bomb; sleep 5");
    req.timeout_ms = 2000;
    let r = sb.exec(&req).unwrap();
    // Either the deadline hits, or the shell itself cannot fork `sleep` any more.
    assert!(
        r.termination == Termination::TimedOut
            || String::from_utf8_lossy(&r.stderr).contains("fork"),
        "{r:?}"
    );
    // Every process of the bomb is gone, init survives, and the sandbox still works.
    sb.kill_all().unwrap();
    assert_eq!(sb.health().unwrap().processes, 0);
    assert_eq!(out(&sh(&mut sb, "echo alive")), "alive\n");
    // The host can still fork.
    assert!(std::process::Command::new("true")
        .status()
        .unwrap()
        .success());
}

#[test]
fn memory_bomb_is_oom_killed_inside_the_sandbox_only() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sb
        .exec(&ExecRequest::argv([
            "perl",
            "-e",
            "$x = q(a) x (512 * 1024 * 1024); print length $x",
        ]))
        .unwrap();
    assert_eq!(r.termination, Termination::Signaled(9), "{r:?}");
    assert!(
        r.oom_killed,
        "the kill must be attributed to the memory limit: {r:?}"
    );
    assert_eq!(
        out(&sh(&mut sb, "echo alive")),
        "alive\n",
        "init survives the OOM"
    );
    // Through a shell the kill shows as status 137 and is still attributed.
    let r = sh(&mut sb, "perl -e '$x = q(a) x (512 * 1024 * 1024)'");
    assert_eq!(r.exit_code(), 137);
    assert!(r.oom_killed);
    // A SIGKILL of the command's own after those two is not the OOM killer's (the count read
    // before it already holds both), and a third OOM kill is counted on top of them.
    let r = sh(&mut sb, "kill -9 $$");
    assert_eq!(r.exit_code(), 137);
    assert!(!r.oom_killed, "{r:?}");
    let r = sh(&mut sb, "perl -e '$x = q(a) x (512 * 1024 * 1024)'");
    assert!(r.oom_killed, "a third OOM kill is counted too: {r:?}");
}

#[test]
fn disk_fill_hits_the_quota_with_enospc_and_reset_frees_it() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        "dd if=/dev/zero of=/root/fill bs=1M count=64 2>&1; echo rc=$?",
    );
    let o = out(&r);
    assert!(o.contains("No space left on device"), "{o}");
    assert!(o.contains("rc=1"), "{o}");
    sb.reset().unwrap();
    let r = sh(
        &mut sb,
        "dd if=/dev/zero of=/root/fill bs=1M count=8 2>/dev/null && echo ok",
    );
    assert_eq!(out(&r), "ok\n");
}

#[test]
fn rm_rf_root_is_undone_by_reset_and_never_reaches_the_next_sandbox() {
    require_root!();
    let rt = runtime();
    let mut a = rt.create(&small()).unwrap();
    let r = sh(
        &mut a,
        "rm -rf /etc /bin /usr/bin /lib 2>/dev/null; [ -e /usr/bin/env ] || echo gone",
    );
    assert_eq!(out(&r), "gone\n", "the agent may wreck its own root: {r:?}");
    // The rest of / (over 100k files on a typical host) until the step's deadline.
    let mut req = ExecRequest::shell("rm -rf --no-preserve-root / 2>/dev/null");
    req.timeout_ms = 3000;
    let _ = a.exec(&req);
    let mut b = rt.create(&small()).unwrap();
    assert_eq!(
        out(&sh(
            &mut b,
            "test -x /bin/sh && test -e /dev/null && echo intact"
        )),
        "intact\n"
    );
    a.reset().unwrap();
    assert_eq!(
        out(&sh(
            &mut a,
            "test -x /usr/bin/env && test -c /dev/null && echo restored"
        )),
        "restored\n"
    );
    // The host is untouched.
    assert!(std::path::Path::new("/usr/bin/env").exists());
}

#[test]
fn host_private_files_are_invisible() {
    require_root!();
    let tag = format!("envfactory-canary-{}", std::process::id());
    let root_canary = std::path::PathBuf::from("/root").join(&tag);
    let tmp_canary = std::path::PathBuf::from("/tmp").join(&tag);
    std::fs::write(&root_canary, "secret").unwrap();
    std::fs::write(&tmp_canary, "secret").unwrap();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        &format!(
            "cat /root/{tag} /tmp/{tag} 2>&1; ls /home /root /tmp | wc -l; test -e /etc/shadow && echo SHADOW; \
             test -e /work && echo WORK; test -e /var/lib/envfactory && echo STATE; ls /etc/ssh 2>/dev/null | grep -c _key$; \
             test -r /etc/passwd && echo passwd-ok"
        ),
    );
    let _ = std::fs::remove_file(&root_canary);
    let _ = std::fs::remove_file(&tmp_canary);
    let o = out(&r);
    assert!(!o.contains("secret"), "{o}");
    assert!(o.contains("No such file"), "{o}");
    for leak in ["SHADOW", "WORK", "STATE"] {
        assert!(!o.contains(leak), "{leak} visible: {o}");
    }
    assert!(o.contains("passwd-ok"), "system files stay readable: {o}");
    let lines: Vec<&str> = o.lines().collect();
    assert!(
        lines.contains(&"0"),
        "fresh /home, /root, /tmp and no private ssh keys: {o}"
    );
}

/// The host mask's walk is remembered across runtimes (`sandbox::host_walk`): a file of
/// `/etc` that was world-readable when the walk was remembered and is made private later must
/// be hidden from the next sandbox, as a fresh walk would hide it. (The runtime checks the
/// remembered plan while that sandbox's init sets up; the sandbox made on the stale plan must
/// be dropped and made again, never returned.)
#[test]
fn an_etc_file_made_private_after_the_walk_was_remembered_is_hidden() {
    require_root!();
    use sandbox::host_walk::{with_host, Source};
    use std::os::unix::fs::PermissionsExt;
    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let name = format!("envfactory-walk-canary-{}", std::process::id());
    let canary = Remove(std::path::Path::new("/etc").join(&name));
    std::fs::write(&canary.0, "secret").unwrap();
    std::fs::set_permissions(&canary.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    // Times newer than the settle window are never remembered: wait until the canary's (and
    // /etc's) are older, so the walk below is remembered.
    std::thread::sleep(sandbox::digest_cache::SETTLE + std::time::Duration::from_millis(200));
    let rt = runtime();
    let cache = sandbox::state::digest_cache_dir(rt.state_dir());
    let plan = || {
        with_host(&cache, "attack-test-ops", |host| {
            let mut rec = sandbox::sys::Recorder::default();
            sandbox::layers::plan_host_mask(&mut rec, std::path::Path::new("/"), host)?;
            Ok(rec.ops)
        })
        .unwrap()
    };
    let hides = |ops: &[sandbox::sys::Op]| {
        ops.iter()
            .any(|op| matches!(op, sandbox::sys::Op::Mknod { path, .. } if path.ends_with(&name)))
    };
    let (first, _) = plan();
    let (again, source) = plan();
    assert_eq!(
        source,
        Source::Remembered,
        "an unchanged host is not walked again"
    );
    assert_eq!(first, again, "the remembered plan is the mask a walk plans");
    assert!(!hides(&again), "a world-readable file passes through");
    let mut sb = rt.create(&small()).unwrap();
    assert!(out(&sh(&mut sb, &format!("cat /etc/{name}"))).contains("secret"));
    drop(sb);
    // A runtime keeps its first host mask: a long-lived one asks whether it is still current.
    assert!(rt.host_mask_current().unwrap(), "an unchanged host");

    std::fs::set_permissions(&canary.0, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(
        !rt.host_mask_current().unwrap(),
        "a file made private since the runtime's mask was made"
    );
    drop(rt);
    let (after, source) = plan();
    assert_eq!(
        source,
        Source::Walked,
        "a chmod invalidates the remembered walk"
    );
    assert!(hides(&after), "the private file is whited out");
    let rt = runtime();
    let mut sb = rt.create(&small()).unwrap();
    let o = out(&sh(&mut sb, &format!("cat /etc/{name} 2>&1; echo rc=$?")));
    assert!(!o.contains("secret") && o.contains("No such file"), "{o}");
}

/// The host mask store's entry (`sandbox::mask_store`, on `/dev/shm`, shared by runs) is
/// checked against its plan on every use, also when the runtime leaves that check to run
/// while the sandbox's init sets up (a remembered walk, as every one-shot has): a whiteout
/// removed from the entry after it was built must never show the file it hid. The sandbox
/// made on the tampered entry is dropped before any command runs, and the entry is built
/// again. (A private store, so that no other test's sandboxes see the tampered entry.)
#[test]
fn a_tampered_host_mask_entry_is_never_used_even_when_its_check_is_deferred() {
    require_root!();
    let shm = tempfile::Builder::new()
        .prefix("envfactory-attack-store")
        .tempdir_in("/dev/shm")
        .unwrap();
    let store = shm.path().join("store");
    let state = runtime().state_dir().to_path_buf();
    let make = || {
        let _starting = serial(&RUNTIME_START);
        sandbox::Runtime::with_mask_store(&state, init_program(), Some(&store)).unwrap()
    };
    let probe = "test -e /etc/shadow && echo SHADOW; echo done";
    let rt = make();
    let mut sb = rt.create(&small()).unwrap();
    assert_eq!(out(&sh(&mut sb, probe)), "done\n", "hidden by the mask");
    let entry =
        std::path::PathBuf::from(&rt.resolve(&sandbox::RootfsSpec::Host).unwrap().lowers[0]);
    assert!(
        entry.starts_with(&store),
        "the store's entry: {}",
        entry.display()
    );
    drop(sb);
    drop(rt);
    // Until a create took the deferred path (a remembered walk: none while another test has
    // just changed /etc, so a round that did not waits out the settle window), at least twice.
    let mut deferred = 0;
    for round in 0..6 {
        std::fs::remove_file(entry.join("etc/shadow")).unwrap();
        let rt = make();
        let mut sb = rt.create(&small()).unwrap();
        assert_eq!(
            out(&sh(&mut sb, probe)),
            "done\n",
            "round {round}: /etc/shadow stays hidden"
        );
        let w = std::fs::symlink_metadata(entry.join("etc/shadow")).unwrap();
        assert!(
            std::os::unix::fs::FileTypeExt::is_char_device(&w.file_type()),
            "round {round}: the entry was built again, with its whiteout"
        );
        deferred += rt.deferred_entry_checks();
        if deferred > 0 && round >= 1 {
            break;
        }
        if rt.deferred_entry_checks() == 0 {
            std::thread::sleep(sandbox::digest_cache::SETTLE);
        }
    }
    assert!(
        deferred > 0,
        "no create checked the entry while its init set up"
    );
}

#[test]
fn mounting_and_loading_modules_are_refused() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(&mut sb, "mount -t tmpfs none /mnt 2>&1; echo rc=$?");
    assert!(
        out(&r).contains("rc=32") || out(&r).contains("rc=1"),
        "{}",
        out(&r)
    );
    assert!(
        out(&r).to_lowercase().contains("permission denied")
            || out(&r).contains("must be superuser"),
        "{}",
        out(&r)
    );
    // Raw syscalls: mount(165), init_module(175), finit_module(313), unshare(272), kexec_load(246).
    let r = sh(
        &mut sb,
        "perl -e 'for $n (165, 175, 313, 246) { $r = syscall($n, 0, 0, 0, 0, 0); print \"$n:$r:\", $!+0, \"\\n\" } \
         $r = syscall(272, 0x10000000); print \"272:$r:\", $!+0, \"\\n\"'",
    );
    for line in out(&r).lines() {
        assert!(
            line.ends_with(":-1:1"),
            "syscall not refused with EPERM: {line}"
        );
    }
    assert_eq!(out(&r).lines().count(), 5);
}

#[test]
fn init_cannot_be_ptraced_read_or_killed() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    // ptrace(PTRACE_ATTACH=16, 1)
    let r = sh(
        &mut sb,
        "perl -e '$r = syscall(101, 16, 1, 0, 0); print \"$r:\", $!+0'",
    );
    assert_eq!(out(&r), "-1:1", "ptrace must fail with EPERM");
    let r = sh(
        &mut sb,
        "head -c 16 /proc/1/mem 2>&1; cat /proc/1/environ 2>&1; ls /proc/1/root/ 2>&1 | head -3",
    );
    let o = out(&r);
    assert!(
        o.contains("ermission denied") || o.contains("Operation not permitted"),
        "{o}"
    );
    assert!(!o.contains("PATH="), "{o}");
    let r = sh(
        &mut sb,
        "kill -9 1; kill -STOP 1; kill -TERM 1; sleep 0.1; echo sent",
    );
    assert_eq!(out(&r), "sent\n");
    let h = sb.health().unwrap();
    assert_eq!(h.pid_in_sandbox, 1);
    // The zygote that forks commands has a command's privileges only: reading its memory is
    // refused, and killing it just makes init start a new one for the next command.
    let r = sh(
        &mut sb,
        "head -c 16 /proc/2/mem 2>&1; kill -9 2; echo killed",
    );
    let o = out(&r);
    assert!(
        o.contains("ermission denied") && o.ends_with("killed\n"),
        "{o}"
    );
    assert_eq!(out(&sh(&mut sb, "echo still-serving")), "still-serving\n");
}

#[test]
fn host_loopback_services_are_unreachable() {
    require_root!();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        &format!(
            "bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>&1; echo rc=$?; ls /sys/class/net"
        ),
    );
    let o = out(&r);
    assert!(o.contains("Connection refused"), "{o}");
    assert!(o.contains("rc=1"), "{o}");
    assert!(o.ends_with("lo\n"), "only loopback exists: {o}");
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection"
    );
    // Loopback inside works.
    let r = sh(
        &mut sb,
        "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 8080)); s.listen(); print(\"bound\")'",
    );
    assert_eq!(out(&r), "bound\n", "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn proc_sys_and_sys_are_read_only() {
    require_root!();
    // Writing back the host's own value: harmless even if it were not refused.
    let before = std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").unwrap();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        &format!("echo {} > /proc/sys/kernel/dmesg_restrict 2>&1; echo rc=$?; echo x > /sys/kernel/uevent_helper 2>&1; echo rc=$?; \
         wc -c < /proc/kallsyms; grep -c . /proc/keys", before.trim()),
    );
    let o = out(&r);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(
        o, "rc=2\nrc=2\n0\n0\n",
        "kernel symbols and keys are masked: {o} {err}"
    );
    assert!(err.contains("Read-only file system"), "{err}");
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/dmesg_restrict").unwrap(),
        before
    );
}

/// A command may not write another process's memory through `/proc/PID/mem` (the file-based
/// twin of ptrace, which seccomp denies): all of `/proc` is read-only for commands. Reading
/// it still works, and commands still get the OOM score the zygote sets for them.
#[test]
fn another_process_memory_cannot_be_written_through_proc() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    // The victim is a shell of the same uid; its text segment is mapped at the address that
    // /proc/PID/maps names first. Opening its mem for writing must fail before any write.
    let r = sh(
        &mut sb,
        "sleep 30 & p=$!; a=$(head -n1 /proc/$p/maps | cut -d- -f1); \
         perl -e 'open(my $f, \"+<\", \"/proc/$ARGV[0]/mem\") or die \"open: $!\\n\"; \
           seek($f, hex($ARGV[1]), 0); my $n = syswrite($f, \"\\xcc\"); \
           print defined $n ? \"wrote $n\\n\" : \"write: $!\\n\"' $p $a 2>&1; \
         echo oom=$(cat /proc/self/oom_score_adj); grep -c . /proc/$p/status; kill $p",
    );
    let o = out(&r);
    assert!(o.contains("open: Read-only file system"), "{o}");
    assert!(!o.contains("wrote"), "{o}");
    assert!(
        o.contains("oom=1000"),
        "the zygote still sets commands' OOM score: {o}"
    );
    let status_lines: usize = o.lines().filter_map(|l| l.parse().ok()).next().unwrap_or(0);
    assert!(status_lines > 10, "/proc stays readable: {o}");
}

#[test]
fn output_flood_is_capped_and_flagged() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let mut req = ExecRequest::shell("head -c 1G /dev/zero; echo done >&2");
    req.output_cap = 1 << 20;
    req.timeout_ms = 60_000;
    let r = sb.exec(&req).unwrap();
    assert_eq!(r.termination, Termination::Exited(0));
    assert_eq!(r.stdout.len(), 1 << 20);
    assert!(r.stdout_truncated);
    assert!(!r.stderr_truncated);
    assert_eq!(r.stderr, b"done\n");
}

#[test]
fn runaway_and_background_processes_die_on_timeout_and_reset() {
    require_root!();
    // Its `sleep 1000` would count in the crash test's host-wide count.
    let _host = serial(&HOST_PROCESSES);
    let mut sb = runtime().create(&small()).unwrap();
    let mut req = ExecRequest::shell("sleep 100 & sleep 100 | cat; sleep 100");
    req.timeout_ms = 300;
    let r = sb.exec(&req).unwrap();
    assert_eq!(r.termination, Termination::TimedOut);
    assert_eq!(r.exit_code(), 124);
    assert_eq!(
        sb.health().unwrap().processes,
        0,
        "the whole tree is killed"
    );
    // A daemon that escapes the session survives the step but not the reset.
    let r = sh(
        &mut sb,
        "setsid sleep 1000 >/dev/null 2>&1 < /dev/null & echo started",
    );
    assert_eq!(out(&r), "started\n");
    assert!(sb.health().unwrap().processes >= 1);
    sb.reset().unwrap();
    assert_eq!(sb.health().unwrap().processes, 0);
}

#[test]
fn setuid_binaries_do_not_elevate() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        "cp /usr/bin/id /root/suid-id && chmod 4755 /root/suid-id && \
         setpriv --reuid=1000 --regid=1000 --clear-groups /root/suid-id -u",
    );
    assert_eq!(out(&r), "1000\n", "{}", String::from_utf8_lossy(&r.stderr));
}

#[test]
fn capabilities_are_dropped_and_no_new_privs_is_set() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let r = sh(
        &mut sb,
        "grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status",
    );
    let o = out(&r);
    let field = |k: &str| {
        o.lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
            .unwrap_or_default()
    };
    let mut keep = sandbox::caps::DEFAULT_KEEP.to_vec();
    keep.sort();
    assert_eq!(
        sandbox::caps::parse_cap_mask(&field("CapEff:")),
        keep,
        "{o}"
    );
    assert_eq!(
        sandbox::caps::parse_cap_mask(&field("CapBnd:")),
        keep,
        "{o}"
    );
    assert_eq!(field("NoNewPrivs:"), "1");
    assert_eq!(field("Seccomp:"), "2", "a seccomp filter is installed");
}

/// Regression: an agent that kills every process it can (the zygote included), repeatedly,
/// right after episode starts, never makes a later command fail to start.
#[test]
fn killing_everything_including_the_zygote_never_breaks_the_next_command() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    for i in 0..20 {
        let _ = sb.exec(&ExecRequest::shell("kill -9 -1")).unwrap();
        if i % 2 == 0 {
            sb.reset().unwrap();
            // Killed again before the prestarted zygote may even be ready.
            let _ = sb.exec(&ExecRequest::shell("kill -9 -1")).unwrap();
        }
        let r = sb.exec(&ExecRequest::shell("echo alive")).unwrap();
        assert_eq!(r.stdout, b"alive\n", "round {i}: {r:?}");
    }
}

/// A command that kills the zygote (with everything else) at once runs exactly once: init
/// learns its pid from the command itself, so the zygote's missing answer is never taken for
/// a command that did not start (which init would start a second time).
#[test]
fn a_command_that_kills_the_zygote_at_once_runs_exactly_once() {
    require_root!();
    let mut sb = runtime().create(&small()).unwrap();
    let rounds = 40;
    for i in 0..rounds {
        let r = sb
            .exec(&ExecRequest::shell("kill -9 -1; echo ran >> /tmp/ran"))
            .unwrap();
        assert_eq!(r.termination, Termination::Exited(0), "round {i}: {r:?}");
    }
    let r = sb.exec(&ExecRequest::shell("wc -l < /tmp/ran")).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&r.stdout).trim(),
        rounds.to_string()
    );
}
