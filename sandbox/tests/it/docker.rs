//! The Docker parts on a real Docker engine (a private `dockerd` of this test process, see
//! `sandbox::docker_testing`): `docker:IMAGE` root filesystems for native sandboxes, hostile
//! image layers, and the Docker backend (exec, files, kill, reset, snapshots, limits).

use crate::common::{self, require_root, LAYER_STORE};
use sandbox::docker::{DockerBackend, DockerSandbox};
use sandbox::docker_testing::{rootfs_tar, Daemon};
use sandbox::protocol::{FailureKind, FileKind};
use sandbox::{
    require_docker, Backend, ExecRequest, RootfsSpec, SandboxConfig, SandboxError, SandboxOps,
    Termination,
};
use std::sync::OnceLock;

const PROGRAMS: &[&str] = &[
    "sh", "ls", "cat", "echo", "sleep", "mkdir", "rm", "touch", "id", "env", "true", "head", "seq",
    "wc", "ln", "kill",
];

/// The test image (`envfactory-test:small`), imported once per process.
fn small_image(d: &Daemon) -> &'static str {
    static IMAGE: OnceLock<()> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("rootfs.tar");
        rootfs_tar(&tar, PROGRAMS, &[]);
        d.import(&tar, "envfactory-test:small");
    });
    "envfactory-test:small"
}

fn docker_config(image: &str) -> SandboxConfig {
    SandboxConfig {
        rootfs: RootfsSpec::Docker(image.into()),
        ..SandboxConfig::default()
    }
}

fn container(d: &Daemon) -> DockerSandbox {
    let backend = DockerBackend::new(d.client(), &d.dir.join("work"));
    backend.create(&docker_config(small_image(d))).unwrap()
}

fn sh(sb: &mut DockerSandbox, cmd: &str) -> sandbox::ExecResult {
    sb.exec(&ExecRequest::shell(cmd)).unwrap()
}

fn stdout(r: &sandbox::ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).trim().to_string()
}

#[test]
fn a_docker_image_is_a_native_root_filesystem_cached_by_its_id() {
    require_root!();
    let d = require_docker!();
    let image = small_image(d);
    let _store = common::serial(&LAYER_STORE);
    let rt = common::runtime();
    let spec: RootfsSpec = format!("docker:{image}").parse().unwrap();
    assert_eq!(spec, RootfsSpec::Docker(image.into()));
    let first = rt.resolve(&spec).unwrap();
    let mut sb = rt
        .create(&SandboxConfig {
            rootfs: spec.clone(),
            ..SandboxConfig::default()
        })
        .unwrap();
    // The image's programs, not the host's: only what the test image holds.
    let r = common::sh(&mut sb, "ls /usr/bin | wc -l; test -e /usr/bin/perl && echo host-perl; echo x > /root/y; cat /root/y");
    let lines: Vec<String> = common::out(&r).lines().map(String::from).collect();
    let count: usize = lines[0].parse().unwrap();
    assert!(count < 40, "the image has few programs, saw {count}");
    assert_eq!(&lines[1..], ["x"], "{lines:?}");
    drop(sb);
    // The same image under another name: the same layers, from the record of its id.
    d.cli(&["tag", image, "envfactory-test:alias"]);
    let other = common::runtime()
        .resolve(&"docker:envfactory-test:alias".parse().unwrap())
        .unwrap();
    assert_eq!(other, first);
    let id = d.cli(&["image", "inspect", "--format", "{{.Id}}", image]);
    let record = sandbox::state::default_state_dir()
        .join("docker-images")
        .join(format!("{}.json", id.trim_start_matches("sha256:")));
    assert!(record.is_file(), "no cache record at {}", record.display());
}

#[test]
fn a_missing_image_is_a_clear_error() {
    require_root!();
    let _d = require_docker!();
    let rt = common::runtime();
    let e = rt
        .resolve(&"docker:envfactory-test:no-such-tag".parse().unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("envfactory-test:no-such-tag") && e.contains("not in the local Docker daemon"),
        "{e}"
    );
    assert!("docker:".parse::<RootfsSpec>().is_err());
}

/// A tar entry: its raw name, kind and link target.
type TarEntry<'a> = (&'a str, tar::EntryType, Option<&'a str>);

/// A layer tar with `../` entries and a write through an absolute symlink: the daemon's own
/// `docker import` either refuses it or stores it tamed; whatever it exports, nothing lands
/// outside the layer store when it is resolved.
#[test]
fn hostile_layer_paths_never_escape() {
    require_root!();
    let d = require_docker!();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("escaped");
    std::fs::create_dir(&target).unwrap();
    let link = target.to_string_lossy().into_owned();
    let variants: [(&str, Vec<TarEntry>); 2] = [
        (
            "dotdot",
            vec![
                ("ok", tar::EntryType::Regular, None),
                ("../../../../../../escape-up", tar::EntryType::Regular, None),
            ],
        ),
        (
            "symlink",
            vec![
                ("link", tar::EntryType::Symlink, Some(link.as_str())),
                ("link/pwned", tar::EntryType::Regular, None),
            ],
        ),
    ];
    for (variant, entries) in variants {
        let tar_path = dir.path().join(format!("{variant}.tar"));
        let mut b = tar::Builder::new(std::fs::File::create(&tar_path).unwrap());
        for (name, kind, target) in entries {
            let mut h = tar::Header::new_gnu();
            // Written raw: the tar crate itself refuses `..` in a path.
            h.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_entry_type(kind);
            h.set_mode(0o755);
            let data: &[u8] = if kind == tar::EntryType::Regular {
                b"x\n"
            } else {
                b""
            };
            h.set_size(data.len() as u64);
            if let Some(l) = target {
                h.set_link_name(l).unwrap();
            }
            h.set_cksum();
            b.append(&h, data).unwrap();
        }
        b.finish().unwrap();
        drop(b);
        let image = format!("envfactory-test:hostile-{variant}");
        let out = std::process::Command::new("docker")
            .args(["-H", &d.host, "import"])
            .arg(&tar_path)
            .arg(&image)
            .output()
            .unwrap();
        eprintln!(
            "docker import of the {variant} tar: {} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if out.status.success() {
            let _store = common::serial(&LAYER_STORE);
            let rt = common::runtime();
            match rt.resolve(&format!("docker:{image}").parse().unwrap()) {
                Ok(_) => eprintln!("{variant}: the daemon's export of it was tame, and imported"),
                Err(e) => eprintln!("{variant}: the import refused its export: {e}"),
            }
        }
    }
    assert!(
        !target.join("pwned").exists(),
        "a write went through the symlink"
    );
    assert!(!std::path::Path::new("/escape-up").exists());
    assert!(!dir.path().join("escape-up").exists());
}

#[test]
fn commands_run_with_stdin_timeouts_and_output_caps() {
    require_root!();
    let d = require_docker!();
    let mut sb = container(d);
    let r = sh(&mut sb, "echo out; echo err >&2; exit 3");
    assert_eq!(r.termination, Termination::Exited(3));
    assert_eq!(stdout(&r), "out");
    assert_eq!(String::from_utf8_lossy(&r.stderr).trim(), "err");

    let mut req = ExecRequest::argv(["cat"]);
    req.stdin = b"from stdin\n".to_vec();
    let r = sb.exec(&req).unwrap();
    assert_eq!(stdout(&r), "from stdin");

    let mut req = ExecRequest::shell("head -c 100000 /dev/zero; echo done >&2");
    req.output_cap = 1000;
    let r = sb.exec(&req).unwrap();
    assert!(r.success(), "{r:?}");
    assert_eq!(r.stdout.len(), 1000);
    assert!(r.stdout_truncated && !r.stderr_truncated);

    // The timeout kills the command and what it forked (still in its process group).
    let mut req = ExecRequest::shell("sleep 300 & sleep 301; echo never");
    req.timeout_ms = 500;
    let r = sb.exec(&req).unwrap();
    assert_eq!(r.termination, Termination::TimedOut);
    assert!(
        common::eventually(10, || sb.health().unwrap().processes == 0),
        "{:?}",
        sb.health()
    );

    let mut req = ExecRequest::shell("id -u; id -g");
    req.user = Some((65534, 65534));
    assert_eq!(stdout(&sb.exec(&req).unwrap()), "65534\n65534");
    let mut req = ExecRequest::shell("echo $FOO; pwd");
    req.env = Some(vec!["FOO=bar".into(), "PATH=/usr/bin:/bin".into()]);
    req.cwd = "/tmp".into();
    assert_eq!(stdout(&sb.exec(&req).unwrap()), "bar\n/tmp");
}

#[test]
fn files_are_served_inside_the_container_root() {
    require_root!();
    let d = require_docker!();
    let mut sb = container(d);
    sb.write_file("/root/note", b"hello", 0o640).unwrap();
    assert_eq!(stdout(&sh(&mut sb, "cat /root/note")), "hello");
    let (data, cut) = sb.read_file("/root/note", 3).unwrap();
    assert_eq!((data.as_slice(), cut), (&b"hel"[..], true));
    let st = sb.stat("/root/note").unwrap();
    assert_eq!((st.kind, st.mode, st.size), (FileKind::File, 0o640, 5));
    let listed = sb.list_dir("/root").unwrap();
    assert_eq!((listed.len(), listed[0].name.as_str()), (1, "note"));
    // An observation's overview: the same listing from this host, the writable layer's usage
    // (the daemon is asked for its path once per container), and no listing where none can be.
    let o = sb.overview("/root", 64).unwrap();
    assert_eq!(
        o.entries,
        Some(vec![sandbox::protocol::ShownEntry {
            name: "note".into(),
            is_dir: false
        }])
    );
    assert_eq!(o.upper_bytes, sb.health().unwrap().upper_bytes);
    sh(&mut sb, "head -c 1048576 /dev/zero > /root/big");
    let grown = sb.overview("/root/big", 64).unwrap();
    assert_eq!(grown.entries, None, "a file is no directory to list");
    assert!(
        grown.upper_bytes >= o.upper_bytes + 1_000_000,
        "{} -> {}",
        o.upper_bytes,
        grown.upper_bytes
    );
    sh(&mut sb, "rm /root/big");
    // A symlink planted inside resolves inside: the host's file is never read.
    std::fs::write("/tmp/envfactory-docker-host-secret", b"host").unwrap();
    sh(
        &mut sb,
        "ln -s /../../../../tmp/envfactory-docker-host-secret /root/escape",
    );
    let e = sb.read_file("/root/escape", 100).unwrap_err();
    assert!(
        matches!(
            e,
            SandboxError::Request {
                kind: FailureKind::NotFound,
                ..
            }
        ),
        "{e}"
    );
    let e = sb.read_file_nofollow("/root/escape", 100).unwrap_err();
    assert!(
        matches!(
            e,
            SandboxError::Request {
                kind: FailureKind::Invalid,
                ..
            }
        ),
        "{e}"
    );
    let _ = std::fs::remove_file("/tmp/envfactory-docker-host-secret");
    // The container's own /proc: its processes, PID 1 first.
    assert!(sb.list_dir("/proc").unwrap().iter().any(|e| e.name == "1"));
}

#[test]
fn reset_snapshot_rollback_and_kill_all() {
    require_root!();
    let d = require_docker!();
    let mut sb = container(d);
    // The writable layer's usage follows the container the handle has now (its path is asked
    // of the daemon once per container): 1 MiB written after a rollback or a reset shows.
    let grows = |sb: &mut DockerSandbox| {
        let before = sb.overview("/", 0).unwrap().upper_bytes;
        sh(sb, "head -c 1048576 /dev/zero > /root/mib");
        let after = sb.overview("/", 0).unwrap().upper_bytes;
        sh(sb, "rm /root/mib");
        assert!(after >= before + 1_000_000, "{before} -> {after}");
    };
    grows(&mut sb);
    sh(&mut sb, "echo 1 > /root/a");
    let snap = sb.snapshot().unwrap();
    sh(
        &mut sb,
        "echo 2 > /root/a; rm /usr/bin/ls; sleep 1000 >/dev/null 2>&1 &",
    );
    assert!(common::eventually(5, || sb.health().unwrap().processes >= 1));
    sb.kill_all().unwrap();
    assert_eq!(sb.health().unwrap().processes, 0);
    assert_eq!(stdout(&sh(&mut sb, "cat /root/a")), "2");
    sb.rollback(snap).unwrap();
    assert_eq!(
        stdout(&sh(&mut sb, "cat /root/a; test -e /usr/bin/ls && echo ls")),
        "1\nls"
    );
    grows(&mut sb);
    sb.reset().unwrap();
    grows(&mut sb);
    let r = sh(&mut sb, "cat /root/a");
    assert!(!r.success(), "the reset container still has the file");
    assert!(sb.rollback(snap).is_err(), "snapshots die with the reset");
    // Killing the container's init from the host ends it: the handle says so.
    let pid = sb.init_pid();
    let id = sb.id().to_string();
    // SAFETY: kill with integer arguments.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    assert!(common::eventually(10, || !sb.is_alive()));
    assert!(matches!(
        sb.exec(&ExecRequest::shell("true")),
        Err(SandboxError::Dead)
    ));
    drop(sb);
    let left = std::process::Command::new("docker")
        .args(["-H", &d.host, "ps", "-aq", "--no-trunc", "--filter"])
        .arg(format!("id={id}"))
        .output()
        .unwrap();
    // Nor the snapshot images (commits are untagged; the test images are tagged).
    let images = d.cli(&["images", "-q", "--filter", "dangling=true"]);
    assert!(
        images.is_empty(),
        "snapshot images were left behind: {images}"
    );
    assert!(
        String::from_utf8_lossy(&left.stdout).trim().is_empty(),
        "the container was left behind"
    );
}

#[test]
fn limits_map_to_docker() {
    require_root!();
    let d = require_docker!();
    let backend = DockerBackend::new(d.client(), &d.dir.join("work"));
    let mut cfg = docker_config(small_image(d));
    cfg.limits.pids = 16;
    cfg.limits.memory_bytes = 64 << 20;
    cfg.hostname = "dockerbox".into();
    let mut sb = backend.create(&cfg).unwrap();
    // Only loopback: the network is `none`.
    let r = sh(
        &mut sb,
        "cat /proc/net/dev | wc -l; cat /proc/sys/kernel/hostname",
    );
    assert_eq!(stdout(&r), "3\ndockerbox", "{r:?}");
    // The pids limit refuses forks past it.
    let r = sh(&mut sb, "for i in $(seq 40); do sleep 30 & done 2>&1; wait");
    let mut req = ExecRequest::shell("ls /proc | wc -l");
    req.timeout_ms = 5000;
    let _ = sb.exec(&req);
    assert!(sb.health().unwrap().processes <= 16, "{r:?}");
    sb.kill_all().unwrap();
    // Capabilities are dropped to the kept set: no mknod.
    let r = sh(
        &mut sb,
        "while read -r k v; do [ \"$k\" = CapEff: ] && echo \"$v\"; done < /proc/self/status",
    );
    assert!(stdout(&r).ends_with("00000000000004fb"), "{r:?}");
}

/// Attack: a sandbox that adds read-only paths of its own (the `read-only-dir` fault) must not
/// lose Docker's defaults, or the container's root could write host sysctls through
/// /proc/sys. The write tried is the UTS-namespaced hostname, harmless if it got through.
#[test]
fn read_only_paths_of_our_own_keep_proc_sys_read_only() {
    require_root!();
    let d = require_docker!();
    let backend = DockerBackend::new(d.client(), &d.dir.join("work"));
    let mut cfg = docker_config(small_image(d));
    cfg.readonly_paths = vec!["/etc".into()];
    let mut sb = backend.create(&cfg).unwrap();
    let r = sh(
        &mut sb,
        "echo pwned > /proc/sys/kernel/hostname && echo wrote; echo x > /proc/sysrq-trigger && echo wrote; touch /etc/x && echo wrote; echo done",
    );
    assert_eq!(stdout(&r), "done", "{r:?}");
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("Read-only file system"),
        "{r:?}"
    );
}
