//! Read-only paths (bound read-only over themselves after every root mount) and a bounded
//! inode count of the writable layer.
use crate::common::*;

#[test]
fn read_only_paths_refuse_writes_by_root_and_stay_read_only_after_reset_and_rollback() {
    require_root!();
    let rt = runtime();
    let mut sb = rt
        .create(&sandbox::SandboxConfig {
            readonly_paths: vec!["/var/log".into(), "/etc/default".into()],
            ..config()
        })
        .unwrap();
    let probe = "touch /var/log/x 2>&1; echo rc=$?; { echo y > /etc/default/y; } 2>&1; echo rc=$?; \
                 touch /root/ok && echo writable; grep -c ' /var/log .*ro[, ]' /proc/self/mountinfo";
    let check = |sb: &mut sandbox::Sandbox, when: &str| {
        let r = sh(sb, probe);
        let o = out(&r);
        assert_eq!(o.matches("Read-only file system").count(), 2, "{when}: {o}");
        assert!(!o.contains("rc=0"), "{when}: {o}");
        assert!(o.contains("writable"), "{when}: only the listed paths: {o}");
        assert!(
            o.trim_end().ends_with('1'),
            "{when}: one read-only mount: {o}"
        );
    };
    check(&mut sb, "at creation");
    // Reading still works, and a file request from init sees the same tree.
    let r = sh(
        &mut sb,
        "ls -d /var/log && cat /etc/default/useradd >/dev/null 2>&1; echo $?",
    );
    assert!(out(&r).starts_with("/var/log\n"), "{}", out(&r));
    sb.reset().unwrap();
    check(&mut sb, "after reset");
    sh(&mut sb, "echo a > /root/a");
    let snap = sb.snapshot().unwrap();
    sh(&mut sb, "echo b > /root/b");
    sb.rollback(snap).unwrap();
    check(&mut sb, "after rollback");
    assert_eq!(
        out(&sh(&mut sb, "cat /root/a; ls /root/b 2>&1 | wc -l")),
        "a\n1\n"
    );
}

#[test]
fn a_read_only_path_that_does_not_exist_fails_the_sandbox_with_its_name() {
    require_root!();
    let rt = runtime();
    let Err(err) = rt.create(&sandbox::SandboxConfig {
        readonly_paths: vec!["/no/such/dir".into()],
        ..config()
    }) else {
        panic!("a missing read-only path must fail");
    };
    assert!(err.to_string().contains("/no/such/dir"), "{err}");
}

#[test]
fn a_symlink_in_the_root_cannot_aim_a_read_only_bind_outside_it() {
    require_root!();
    let rt = runtime();
    // /bin is a symlink to usr/bin on merged-usr hosts; an absolute link resolves inside the
    // root too. Either way the bind lands on the sandbox's own tree.
    let mut sb = rt
        .create(&sandbox::SandboxConfig {
            readonly_paths: vec!["/bin".into()],
            ..config()
        })
        .unwrap();
    let r = sh(&mut sb, "touch /usr/bin/zz 2>&1; echo rc=$?");
    assert!(out(&r).contains("rc=1"), "{}", out(&r));
    assert!(!std::path::Path::new("/usr/bin/zz").exists());
}

#[test]
fn a_bounded_inode_count_gives_enospc_when_files_run_out_and_reset_restores_it() {
    require_root!();
    let rt = runtime();
    let mut sb = rt
        .create(&sandbox::SandboxConfig {
            disk_inodes: Some(200),
            ..config()
        })
        .unwrap();
    let fill = "mkdir /root/f && cd /root/f && i=0; while [ $i -lt 400 ]; do \
                true > f$i 2>/dev/null || break; i=$((i+1)); done; echo made=$i; \
                { true > one-more; } 2>&1; stat -f -c 'free=%d' /";
    let r = sh(&mut sb, fill);
    let o = format!("{}{}", out(&r), String::from_utf8_lossy(&r.stderr));
    let made: u32 = o
        .lines()
        .find_map(|l| l.strip_prefix("made="))
        .unwrap_or_else(|| panic!("{o}"))
        .parse()
        .unwrap();
    assert!(
        (180..=200 + sandbox::mounts::DISK_INODES_RESERVED as u32).contains(&made),
        "{o}"
    );
    assert!(o.contains("No space left on device"), "{o}");
    assert!(o.contains("free=0"), "{o}");
    sb.reset().unwrap();
    let o = out(&sh(&mut sb, "stat -f -c '%c %d' /"));
    let v: Vec<u64> = o.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert!(
        v[1] > 190 && v[0] <= 200 + sandbox::mounts::DISK_INODES_RESERVED,
        "{o}"
    );
}
