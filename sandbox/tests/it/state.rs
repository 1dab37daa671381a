//! Reset, snapshots, rollback, the file requests, the pool and the crash reaper.
use crate::common::*;
use sandbox::{ExecRequest, Pool};

/// Every path, type, mode, owner, size and symlink target under the directories an episode
/// touches, plus the contents of every regular file of /etc and /root.
const MANIFEST: &str = "find /etc /root /tmp /var /usr/bin /opt -xdev -printf '%p %y %m %U %G %s %l\\n' | sort | sha256sum; \
    find /etc /root -xdev -type f -exec sha256sum {} + | sort | sha256sum";

fn manifest(sb: &mut sandbox::Sandbox) -> String {
    let mut req = ExecRequest::shell(MANIFEST);
    req.timeout_ms = 30_000;
    let r = sb.exec(&req).unwrap();
    assert!(r.success(), "{r:?}");
    out(&r)
}

const EPISODE: &str =
    "set -e; mkdir -p /root/work/deep; echo new > /root/work/deep/f; echo x >> /etc/passwd; \
    rm /etc/hostname; chmod 600 /etc/hosts; ln -s /etc/passwd /root/link; rm -rf /etc/apt; \
    mkdir /opt/tool && echo '#!/bin/sh' > /opt/tool/run && chmod 4755 /opt/tool/run; \
    for i in $(seq 100); do echo $i > /tmp/f$i; done; mv /usr/bin/env /usr/bin/env.bak";

#[test]
fn reset_restores_exactly_the_base_after_creates_modifies_and_deletes() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let base = manifest(&mut sb);
    let r = sh(&mut sb, EPISODE);
    assert!(r.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_ne!(manifest(&mut sb), base, "the episode changed the tree");
    sb.reset().unwrap();
    assert_eq!(manifest(&mut sb), base);
    // A second episode and reset behave the same.
    assert!(sh(&mut sb, EPISODE).success());
    sb.reset().unwrap();
    assert_eq!(manifest(&mut sb), base);
}

#[test]
fn snapshot_and_rollback_return_to_the_frozen_state() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let base = manifest(&mut sb);
    assert!(sh(
        &mut sb,
        "echo one > /root/a; rm /etc/hostname; mkdir /root/d; ln -s a /root/l"
    )
    .success());
    // A background process keeps running through a snapshot.
    assert!(sh(&mut sb, "setsid sleep 100 >/dev/null 2>&1 </dev/null &").success());
    let s1 = sb.snapshot().unwrap();
    assert_eq!(sb.health().unwrap().processes, 1, "snapshot does not kill");
    let at_s1 = manifest(&mut sb);
    assert!(sh(
        &mut sb,
        "echo two > /root/a; rm -r /root/d; echo b > /root/b; rm /etc/passwd; chmod 700 /root/l"
    )
    .success());
    let s2 = sb.snapshot().unwrap();
    let at_s2 = manifest(&mut sb);
    assert!(sh(&mut sb, "rm -rf /etc /root/*").success());
    sb.rollback(s1).unwrap();
    assert_eq!(manifest(&mut sb), at_s1);
    assert_eq!(
        out(&sh(&mut sb, "cat /root/a; readlink /root/l")),
        "one\na\n"
    );
    assert_eq!(
        sb.health().unwrap().processes,
        0,
        "rollback kills processes"
    );
    sb.rollback(s2).unwrap();
    assert_eq!(manifest(&mut sb), at_s2);
    assert!(sh(&mut sb, "echo three > /root/c").success());
    let s3 = sb.snapshot().unwrap();
    sb.rollback(s1).unwrap();
    assert_eq!(manifest(&mut sb), at_s1);
    sb.rollback(s3).unwrap();
    assert_eq!(out(&sh(&mut sb, "cat /root/c /root/b")), "three\nb\n");
    sb.reset().unwrap();
    assert_eq!(manifest(&mut sb), base);
    let err = sb.rollback(s1).unwrap_err();
    assert!(err.to_string().contains("no snapshot"), "{err}");
}

/// SysV IPC objects outlive every process, like files: a reset or a rollback removes them
/// (they are state of the episode, as `/dev/shm` is).
#[test]
fn reset_and_rollback_remove_sysv_ipc_objects() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let make = "perl -e 'shmget(0, 65536, 01600) // die; msgget(0, 01600) // die; \
                semget(0, 1, 01600) // die'";
    let count = "cat /proc/sysvipc/shm /proc/sysvipc/msg /proc/sysvipc/sem | grep -vc '^ *key'";
    assert!(sh(&mut sb, make).success());
    assert_eq!(out(&sh(&mut sb, count)).trim(), "3");
    sb.reset().unwrap();
    assert_eq!(out(&sh(&mut sb, count)).trim(), "0", "after a reset");
    let s = sb.snapshot().unwrap();
    assert!(sh(&mut sb, make).success());
    sb.rollback(s).unwrap();
    assert_eq!(out(&sh(&mut sb, count)).trim(), "0", "after a rollback");
}

#[test]
fn file_requests_work_without_forking_and_stay_inside_the_root() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    sb.write_file("/root/hello.txt", b"hi there", 0o640)
        .unwrap();
    assert_eq!(
        out(&sh(
            &mut sb,
            "cat /root/hello.txt; stat -c %a /root/hello.txt"
        )),
        "hi there640\n"
    );
    let (data, truncated) = sb.read_file("/root/hello.txt", 2).unwrap();
    assert_eq!((data.as_slice(), truncated), (&b"hi"[..], true));
    // Exactly the limit is whole; one byte under it is cut.
    let (data, truncated) = sb.read_file("/root/hello.txt", 8).unwrap();
    assert_eq!((data.as_slice(), truncated), (&b"hi there"[..], false));
    let (data, truncated) = sb.read_file("/root/hello.txt", 7).unwrap();
    assert_eq!((data.as_slice(), truncated), (&b"hi ther"[..], true));
    let (data, truncated) = sb.read_file("/root/hello.txt", 0).unwrap();
    assert_eq!((data.as_slice(), truncated), (&b""[..], true));
    // A file of many reads, whole and cut.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    sb.write_file("/tmp/big", &big, 0o600).unwrap();
    let (data, truncated) = sb.read_file("/tmp/big", 1 << 20).unwrap();
    assert!(data == big && !truncated, "{} bytes", data.len());
    let (data, truncated) = sb.read_file("/tmp/big", 200_001).unwrap();
    assert!(data == big[..200_001] && truncated, "{} bytes", data.len());
    let st = sb.stat("/root/hello.txt").unwrap();
    assert_eq!(
        (st.kind, st.mode, st.size),
        (sandbox::protocol::FileKind::File, 0o640, 8)
    );
    assert!(sh(&mut sb, "ln -s hello.txt /root/ln; mkdir /root/sub").success());
    let st = sb.stat("/root/ln").unwrap();
    assert_eq!(st.symlink_target.as_deref(), Some("hello.txt"));
    let names: Vec<String> = sb
        .list_dir("/root")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["hello.txt", "ln", "sub"]);

    // Symlinks planted by the agent resolve inside the sandbox root, never on the host.
    let host_target = format!("/tmp/envfactory-escape-{}", std::process::id());
    assert!(sh(
        &mut sb,
        &format!("ln -s {host_target} /root/out; ln -s ../../../../../../etc/shadow /root/shadow")
    )
    .success());
    sb.write_file("/root/out", b"pwned", 0o644).unwrap_err();
    assert!(
        !std::path::Path::new(&host_target).exists(),
        "write escaped to the host"
    );
    // Attack: a FIFO planted where a file is written must neither block the writer (on the
    // Docker backend the writer is the engine itself) nor get the data; a regular file that
    // exists is overwritten from its start.
    assert!(sh(
        &mut sb,
        "mkfifo /root/pipe && printf 0123456789 > /root/long"
    )
    .success());
    let err = sb.write_file("/root/pipe", b"data", 0o644).unwrap_err();
    assert!(!err.is_infrastructure(), "{err}");
    sb.write_file("/root/long", b"ab", 0o644).unwrap();
    assert_eq!(
        out(&sh(&mut sb, "cat /root/long; rm /root/pipe /root/long")),
        "ab"
    );
    let err = sb.read_file("/root/shadow", 100).unwrap_err();
    assert!(err.to_string().contains("No such file"), "{err}");
    assert!(!err.is_infrastructure());
    let err = sb.read_file("relative", 1).unwrap_err();
    assert!(!err.is_infrastructure(), "{err}");

    // The no-follow read: a regular file reads, a final symlink to it does not, a symlink on
    // the way still resolves (in the root), and a directory or a FIFO is not a file.
    assert_eq!(
        sb.read_file_nofollow("/root/hello.txt", 100).unwrap().0,
        b"hi there"
    );
    let invalid = |e: sandbox::SandboxError| {
        matches!(
            e,
            sandbox::SandboxError::Request {
                kind: sandbox::protocol::FailureKind::Invalid,
                ..
            }
        )
    };
    assert_eq!(sb.read_file("/root/ln", 100).unwrap().0, b"hi there");
    assert!(invalid(sb.read_file_nofollow("/root/ln", 100).unwrap_err()));
    assert!(sh(&mut sb, "ln -s /root /lnroot && mkfifo /root/fifo").success());
    assert_eq!(
        sb.read_file_nofollow("/lnroot/hello.txt", 100).unwrap().0,
        b"hi there"
    );
    assert!(invalid(
        sb.read_file_nofollow("/root/sub", 100).unwrap_err()
    ));
    assert!(invalid(
        sb.read_file_nofollow("/root/fifo", 100).unwrap_err()
    ));
}

#[test]
fn an_overview_lists_what_list_dir_lists_in_shown_order_with_the_disk_usage() {
    use sandbox::backend::SandboxOps;
    use sandbox::protocol::{FileKind, ShownEntry};
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    // Names that sort differently once a directory's `/` is shown (`a-b` before `a/`), a
    // symlink to a directory (not one itself), a FIFO, and more entries than are asked for.
    // A name that is not UTF-8 is left out, as list_dir leaves it out.
    assert!(sh(
        &mut sb,
        "mkdir -p /root/ov/a /root/ov/a.d && cd /root/ov && touch a-b 'sp ace' && \
         ln -s a l && mkfifo p && touch \"$(printf 'x\\377')\" && \
         for i in $(seq 70); do : > f$i; done"
    )
    .success());
    assert_eq!(
        out(&sh(&mut sb, "ls /root/ov | wc -l")).trim(),
        "77",
        "the names are there"
    );
    let mut expected: Vec<ShownEntry> = sb
        .list_dir("/root/ov")
        .unwrap()
        .into_iter()
        .map(|e| ShownEntry {
            is_dir: e.stat.kind == FileKind::Dir,
            name: e.name,
        })
        .collect();
    ShownEntry::sort_shown(&mut expected);
    assert_eq!(expected.len(), 76, "all but the name that is not UTF-8");
    let shown = |v: &[ShownEntry]| -> Vec<String> {
        v.iter()
            .map(|e| format!("{}{}", e.name, if e.is_dir { "/" } else { "" }))
            .collect()
    };
    let mut sorted = shown(&expected);
    sorted.sort();
    assert_eq!(shown(&expected), sorted, "the order an observation shows");
    assert_eq!(&shown(&expected)[..4], ["a-b", "a.d/", "a/", "f1"]);
    for max in [0u32, 3, 64, 1000] {
        let o = sb.overview("/root/ov", max).unwrap();
        let want = &expected[..expected.len().min(max as usize)];
        assert_eq!(o.entries.as_deref(), Some(want), "max {max}");
        // The same through the backend seam's default (list_dir + health).
        let d = SandboxOps::overview(&mut DefaultOverview(&mut sb), "/root/ov", max).unwrap();
        assert_eq!(d, o, "max {max}: the default agrees");
    }
    assert!(expected.iter().any(|e| e.name == "l" && !e.is_dir));
    // The disk usage is the health report's, and follows what the agent writes.
    let before = sb.overview("/", 0).unwrap().upper_bytes;
    assert_eq!(before, sb.health().unwrap().upper_bytes);
    assert!(sh(&mut sb, "head -c 1048576 /dev/zero > /root/big").success());
    let after = sb.overview("/", 0).unwrap().upper_bytes;
    assert!(after >= before + 1_000_000, "{before} -> {after}");
    // What cannot be listed is no listing, not a failure of the sandbox: a missing directory,
    // a file, a relative path; a symlink out of the root resolves inside it.
    for path in ["/root/nope", "/root/ov/a-b", "root/ov", "/root/ov/p"] {
        let o = sb.overview(path, 64).unwrap();
        assert_eq!(o.entries, None, "{path}");
        assert_eq!(o.upper_bytes, after);
    }
    assert!(sh(
        &mut sb,
        "ln -s ../../../../../../../root/ov /root/up && ln -s /root/ov /root/abs"
    )
    .success());
    for link in ["/root/up", "/root/abs"] {
        assert_eq!(
            sb.overview(link, 1000).unwrap().entries.as_deref(),
            Some(&expected[..]),
            "{link}"
        );
    }
    // The root itself.
    let top = sb.overview("/", 1000).unwrap().entries.unwrap();
    assert!(top.iter().any(|e| e.name == "root" && e.is_dir), "{top:?}");
}

/// A sandbox seen only through [`SandboxOps`]' provided `overview` (list_dir + health).
struct DefaultOverview<'a>(&'a mut sandbox::Sandbox);

impl sandbox::backend::SandboxOps for DefaultOverview<'_> {
    fn exec(&mut self, r: &ExecRequest) -> Result<sandbox::ExecResult, sandbox::SandboxError> {
        self.0.exec(r)
    }
    fn read_file(&mut self, p: &str, m: u64) -> Result<(Vec<u8>, bool), sandbox::SandboxError> {
        self.0.read_file(p, m)
    }
    fn read_file_nofollow(
        &mut self,
        p: &str,
        m: u64,
    ) -> Result<(Vec<u8>, bool), sandbox::SandboxError> {
        self.0.read_file_nofollow(p, m)
    }
    fn write_file(&mut self, p: &str, d: &[u8], m: u32) -> Result<(), sandbox::SandboxError> {
        self.0.write_file(p, d, m)
    }
    fn stat(&mut self, p: &str) -> Result<sandbox::protocol::FileStat, sandbox::SandboxError> {
        self.0.stat(p)
    }
    fn list_dir(
        &mut self,
        p: &str,
    ) -> Result<Vec<sandbox::protocol::DirEntry>, sandbox::SandboxError> {
        self.0.list_dir(p)
    }
    fn kill_all(&mut self) -> Result<(), sandbox::SandboxError> {
        self.0.kill_all()
    }
    fn reset(&mut self) -> Result<(), sandbox::SandboxError> {
        self.0.reset()
    }
    fn snapshot(&mut self) -> Result<u32, sandbox::SandboxError> {
        self.0.snapshot()
    }
    fn rollback(&mut self, n: u32) -> Result<(), sandbox::SandboxError> {
        self.0.rollback(n)
    }
    fn health(&mut self) -> Result<sandbox::protocol::Health, sandbox::SandboxError> {
        self.0.health()
    }
    fn is_alive(&self) -> bool {
        !self.0.is_dead()
    }
    fn pids_usage(&self) -> (u64, Option<u64>) {
        self.0.pids_usage()
    }
    fn init_pid(&self) -> i32 {
        self.0.init_pid()
    }
    fn export_diff(
        &self,
        dst: &std::path::Path,
        max: u64,
    ) -> Result<Option<u64>, sandbox::SandboxError> {
        self.0.export_diff(dst, max).map(Some)
    }
}

#[test]
fn commands_that_cannot_start_get_clear_errors() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let err = sb
        .exec(&ExecRequest::argv(["no-such-program"]))
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot run \"no-such-program\""),
        "{err}"
    );
    assert!(!err.is_infrastructure());
    let mut req = ExecRequest::argv(["true"]);
    req.cwd = "/nonexistent".into();
    let err = sb.exec(&req).unwrap_err();
    assert!(err.to_string().contains("working directory"), "{err}");
    let err = sb.exec(&ExecRequest::argv(["echo", "a\0b"])).unwrap_err();
    assert!(err.to_string().contains("contains a NUL byte"), "{err}");
    assert!(!err.is_infrastructure());
    let r = sh(&mut sb, "exec nothing-here");
    assert_eq!(r.exit_code(), 127);
    // The sandbox is still fine.
    assert!(sh(&mut sb, "true").success());
}

#[test]
fn stdin_env_and_cwd_reach_the_command() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let mut req = ExecRequest::argv(["sh", "-c", "pwd; echo $FOO; cat"]);
    req.cwd = "/tmp".into();
    req.env = Some(vec!["FOO=bar".into(), "PATH=/usr/bin:/bin".into()]);
    req.stdin = vec![b'z'; 300_000];
    let r = sb.exec(&req).unwrap();
    assert!(r.success());
    assert_eq!(r.stdout.len(), "/tmp\nbar\n".len() + 300_000);
    assert!(r.stdout.starts_with(b"/tmp\nbar\nzzz"));
}

#[test]
fn sandboxes_do_not_see_each_other() {
    require_root!();
    let rt = runtime();
    let mut a = rt.create(&config()).unwrap();
    let mut b = rt.create(&config()).unwrap();
    assert!(sh(
        &mut a,
        "echo a > /tmp/mine; setsid sleep 100 >/dev/null 2>&1 </dev/null &"
    )
    .success());
    assert_eq!(out(&sh(&mut a, "cat /tmp/mine")), "a\n");
    assert_eq!(a.health().unwrap().processes, 1, "a's background job");
    assert_eq!(
        out(&sh(
            &mut b,
            "cat /tmp/mine 2>/dev/null; cat /proc/[0-9]*/comm | grep -c sleep"
        )),
        "0\n",
        "b sees neither a's files nor a's processes"
    );
    assert_eq!(b.health().unwrap().processes, 0);
}

#[test]
fn a_lease_dropped_without_release_is_reset_not_leaked() {
    require_root!();
    let rt = runtime();
    let pool = Pool::new(rt.clone(), config(), 2).unwrap();
    {
        let mut l = pool.lease();
        assert!(sh(
            &mut l,
            "echo dirty > /root/x; setsid sleep 100 >/dev/null 2>&1 </dev/null &"
        )
        .success());
        assert_eq!(pool.idle(), 1);
    } // dropped without release
    assert_eq!(pool.idle(), 2);
    for _ in 0..2 {
        let mut l = pool.lease();
        // The dropped lease's file and its background sleep are gone.
        assert_eq!(
            out(&sh(
                &mut l,
                "cat /root/x 2>/dev/null; cat /proc/[0-9]*/comm | grep -c sleep"
            )),
            "0\n"
        );
        assert_eq!(l.health().unwrap().processes, 0);
        l.release().unwrap();
    }
}

/// Not a test on its own: the body of the crash test's child process.
#[test]
#[ignore]
fn crash_child_holds_sandboxes() {
    let Ok(ready) = std::env::var("ENVFACTORY_CRASH_READY") else {
        return;
    };
    let rt = runtime();
    let mut held = Vec::new();
    let mut pids = Vec::new();
    for _ in 0..2 {
        let mut sb = rt.create(&config()).unwrap();
        assert!(sh(&mut sb, "setsid sleep 1000 >/dev/null 2>&1 </dev/null &").success());
        pids.push(sb.init_pid().to_string());
        held.push(sb);
    }
    std::fs::write(&ready, format!("{} {}", rt.run_id(), pids.join(" "))).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(600));
}

#[test]
fn kill_9_of_the_engine_leaves_nothing_after_the_next_start() {
    require_root!();
    let _host = serial(&HOST_PROCESSES);
    let ready = std::env::temp_dir().join(format!("envfactory-crash-{}", std::process::id()));
    let _ = std::fs::remove_file(&ready);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "state::crash_child_holds_sandboxes",
            "--nocapture",
        ])
        .env("ENVFACTORY_CRASH_READY", &ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready.exists() || std::fs::read_to_string(&ready).unwrap().split(' ').count() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "child never got ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let text = std::fs::read_to_string(&ready).unwrap();
    let _ = std::fs::remove_file(&ready);
    let mut it = text.split(' ');
    let run = it.next().unwrap().to_string();
    let inits: Vec<i32> = it.map(|p| p.parse().unwrap()).collect();
    // From the kill until our own start has reaped the crashed run, no other test's runtime
    // starts (and reaps it first).
    let starting = serial(&RUNTIME_START);
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();

    let state = sandbox::state::default_state_dir();
    let run_dir = state.join("runs").join(&run);
    assert!(
        run_dir.exists(),
        "the crashed run left its state behind (as a crash does)"
    );
    // The next start reaps it.
    let rt = sandbox::testing::runtime_with(init_program());
    drop(starting);
    assert!(!run_dir.exists(), "run directory removed");
    assert!(
        sandbox::state::mounts_under(&run_dir).is_empty(),
        "mounts removed"
    );
    for root in rt.cgroup_roots() {
        assert!(
            !root.join("envfactory").join(&run).exists(),
            "cgroups removed under {}",
            root.display()
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    for pid in inits {
        let alive =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
        assert!(!alive, "init {pid} still alive");
    }
    // No process of the crashed sandboxes survives anywhere: none is in a cgroup of that run,
    // and no `sleep 1000` whose parent chain led to those inits remains.
    let leftovers = || {
        let o = std::process::Command::new("sh")
            .args(["-c", "ps -eo args= | grep -c '^sleep 1000$' || true"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert!(
        eventually(10, || leftovers() == "0"),
        "{} sleep 1000 left",
        leftovers()
    );
}

#[test]
fn orphans_are_reparented_to_init_and_reaped() {
    require_root!();
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    // The shell exits at once; its backgrounded children become init's and exit later.
    assert!(sh(
        &mut sb,
        "for i in 1 2 3 4 5; do (sleep 0.1; exit 3) & done; exit 0"
    )
    .success());
    assert!(
        eventually(10, || sb.health().unwrap().processes == 0),
        "the orphans are reaped, no zombie left behind"
    );
    let r = sh(
        &mut sb,
        "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
    );
    assert_eq!(out(&r), "0\n");
}

#[test]
fn limits_are_written_to_the_sandbox_cgroups() {
    require_root!();
    let rt = runtime();
    let mut cfg = config();
    cfg.limits = sandbox::Limits {
        memory_bytes: 96 << 20,
        pids: 77,
        cpus: 0.5,
    };
    let sb = rt.create(&cfg).unwrap();
    let read = |file: &str| -> Option<String> {
        rt.cgroup_roots().iter().find_map(|root| {
            std::fs::read_to_string(
                root.join("envfactory")
                    .join(rt.run_id())
                    .join(sb.name())
                    .join(file),
            )
            .ok()
        })
    };
    assert_eq!(read("pids.max").unwrap().trim(), "77");
    let mem = read("memory.limit_in_bytes")
        .or_else(|| read("memory.max"))
        .unwrap();
    assert_eq!(mem.trim(), (96u64 << 20).to_string());
    match read("cpu.cfs_quota_us") {
        Some(q) => assert_eq!(q.trim(), "50000"),
        None => assert_eq!(read("cpu.max").unwrap().trim(), "50000 100000"),
    }
    // Init itself is in them (joined through the tasks file).
    let procs = read("cgroup.procs").unwrap();
    assert!(
        procs.lines().any(|p| p.trim() == sb.init_pid().to_string()),
        "{procs}"
    );
}
