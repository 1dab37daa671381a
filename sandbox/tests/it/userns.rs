//! The user-namespace mode: root inside is an unprivileged uid on the host.
use crate::common::*;

fn userns() -> sandbox::SandboxConfig {
    sandbox::SandboxConfig {
        userns: true,
        ..config()
    }
}

#[test]
fn root_inside_is_an_unprivileged_uid_on_the_host() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&userns()).unwrap();
    let r = sh(&mut sb, "id -u; cat /proc/self/uid_map | tr -s ' '; echo hi > /root/x; cat /root/x; touch /logs.tar.gz && echo root-dir-ok");
    assert_eq!(
        out(&r),
        format!(
            "0\n 0 {} 65536\nhi\nroot-dir-ok\n",
            sandbox::config::USERNS_BASE
        ),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    // Seen from the host, a command runs as the mapped uid, not as root.
    assert!(sh(&mut sb, "setsid sleep 30 >/dev/null 2>&1 </dev/null &").success());
    std::thread::sleep(std::time::Duration::from_millis(100));
    let procs: String = rt
        .cgroup_roots()
        .iter()
        .map(|root| {
            std::fs::read_to_string(
                root.join("envfactory")
                    .join(rt.run_id())
                    .join(sb.name())
                    .join("cgroup.procs"),
            )
            .unwrap_or_default()
        })
        .collect();
    let mut saw_sleep = false;
    for pid in procs.lines() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() == "sleep" {
            saw_sleep = true;
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
            assert!(
                uid.contains(&sandbox::config::USERNS_BASE.to_string()),
                "{uid}"
            );
        }
    }
    assert!(saw_sleep, "the sandbox's sleep is in its cgroup: {procs}");
}

#[test]
fn system_files_are_read_only_and_attacks_still_fail() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&userns()).unwrap();
    let r = sh(
        &mut sb,
        "echo x >> /etc/passwd 2>/dev/null || echo passwd-ro; stat -c %U /etc/passwd; \
         mount -t tmpfs none /mnt 2>/dev/null || echo no-mount; \
         perl -e '$r = syscall(101, 16, 1, 0, 0); print \"ptrace:$r\\n\"'",
    );
    assert_eq!(
        out(&r),
        "passwd-ro\nnobody\nno-mount\nptrace:-1\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    // Files written through init belong to root inside.
    sb.write_file("/root/f", b"data", 0o600).unwrap();
    assert_eq!(
        out(&sh(&mut sb, "stat -c %u:%a /root/f; cat /root/f")),
        "0:600\ndata"
    );
    sb.reset().unwrap();
    assert_eq!(out(&sh(&mut sb, "ls /root | wc -l; id -u")), "0\n0\n");
}
