//! Inits started ahead of time (`sandbox/src/init_reserve.rs`): a sandbox given one is set up
//! and confined like one whose init was cloned for it, a spare forked by the reserve's fork
//! server (`init_forker.rs`) starts as an exec'd init does, an init cloned before the engine's
//! mount table changed is never used, and none (nor the forker) outlives its runtime.

use crate::common::{config, out, require_root, runtime, sh};
use sandbox::testing::eventually;
use sandbox::{Runtime, Sandbox};

/// Create sandboxes until one gets a spare init (another test's mount in the host namespace
/// can make a spare stale now and then); the ones that did not are dropped.
fn from_a_spare(rt: &Runtime, cfg: &sandbox::SandboxConfig) -> Sandbox {
    for _ in 0..20 {
        assert!(
            eventually(10, || rt.spare_inits_ready() >= 1),
            "no init was started ahead"
        );
        let before = rt.spare_inits_used().0;
        let sb = rt.create(cfg).unwrap();
        if rt.spare_inits_used().0 > before {
            return sb;
        }
    }
    panic!("20 sandboxes in a row got no spare init");
}

/// The namespaces of a process, by `/proc/PID/ns` links, as the host sees them.
fn namespaces(pid: i32) -> Vec<String> {
    ["mnt", "pid", "net", "uts", "ipc", "cgroup"]
        .iter()
        .map(|n| {
            std::fs::read_link(format!("/proc/{pid}/ns/{n}"))
                .unwrap()
                .display()
                .to_string()
        })
        .collect()
}

#[test]
fn a_sandbox_given_a_spare_init_is_set_up_and_confined_like_any_other() {
    require_root!();
    let rt = runtime();
    let mut cloned = rt.create(&config()).unwrap();
    // No init is started ahead for a process that creates one sandbox.
    assert_eq!(rt.spare_inits_ready(), 0);
    // The reserve starts at the second (which may get a spare already, whose replacement
    // starts once it answered a request).
    let mut second = rt.create(&config()).unwrap();
    sh(&mut second, "true");
    let mut cfg = config();
    cfg.limits.pids = 12;
    cfg.hostname = "spare-test".into();
    let mut s = from_a_spare(&rt, &cfg);
    // Its own namespaces: none shared with the host or with the other sandbox.
    let mine = namespaces(s.init_pid());
    let host = namespaces(std::process::id() as i32);
    let other = namespaces(cloned.init_pid());
    for (i, ns) in mine.iter().enumerate() {
        assert_ne!(ns, &host[i], "shares {ns} with the host");
        assert_ne!(ns, &other[i], "shares {ns} with another sandbox");
    }
    // Its plan arrived: hostname, pid 1, its cgroups as the root of its cgroup namespace,
    // the root filesystem; everything but the hostname as the cloned sandbox sees it.
    let probe = "hostname; tr '\\0' ' ' </proc/1/cmdline; echo; cat /proc/self/cgroup; \
                 ls / /dev; cat /proc/self/status | grep -E '^(Cap|Seccomp|NoNewPrivs|Sig(Ign|Blk))'; \
                 awk '$5 ~ /^\\/(proc|dev|sys)/ {print $5, $6, $9, $11}' /proc/self/mountinfo";
    let (r, r0) = (sh(&mut s, probe), sh(&mut cloned, probe));
    let (o, o0) = (out(&r), out(&r0));
    assert_eq!(o.lines().next(), Some("spare-test"), "{r:?}");
    assert!(o.lines().nth(1).unwrap().contains("init"), "{r:?}");
    assert_eq!(
        o.lines().skip(1).collect::<Vec<_>>(),
        o0.lines().skip(1).collect::<Vec<_>>(),
        "a spare's sandbox differs from a cloned one's"
    );
    // Its init, as the host sees it, is in the same state as the cloned one's.
    let status = |pid: i32| -> Vec<String> {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .filter(|l| {
                [
                    "Uid:",
                    "Gid:",
                    "Groups:",
                    "Cap",
                    "NoNewPrivs:",
                    "Seccomp:",
                    "SigBlk:",
                    "SigIgn:",
                    "SigCgt:",
                    "Cpus_allowed_list:",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .map(str::to_string)
            .collect()
    };
    assert_eq!(status(s.init_pid()), status(cloned.init_pid()));
    // The host sees its init in the sandbox's own cgroups, so the limits apply to it.
    let cg = std::fs::read_to_string(format!("/proc/{}/cgroup", s.init_pid())).unwrap();
    let suffix = format!("/{}/{}", rt.run_id(), s.name());
    assert!(cg.lines().any(|l| l.ends_with(&suffix)), "{cg}");
    for l in cg.lines() {
        if l.contains(":pids:") || l.contains(":memory:") {
            assert!(l.ends_with(&suffix), "{cg}");
        }
    }
    // Its limits are written where the kernel reads them.
    let mut seen = 0;
    for root in rt.cgroup_roots() {
        let dir = root.join("envfactory").join(rt.run_id()).join(s.name());
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .map(|v| v.trim().to_string())
        };
        if let Some(v) = read("pids.max") {
            assert_eq!(v, "12");
            seen += 1;
        }
        if let Some(v) = read("memory.limit_in_bytes").or_else(|| read("memory.max")) {
            assert_eq!(v, cfg.limits.memory_bytes.to_string());
            seen += 1;
        }
    }
    assert_eq!(seen, 2, "no pids or memory cgroup found");
    // The pids limit holds: 12 in all, init and the shell included.
    let r = sh(
        &mut s,
        "n=0; for i in $(seq 30); do sleep 5 & [ $? = 0 ] && n=$((n+1)); done 2>/dev/null; \
         echo $n; kill $(jobs -p) 2>/dev/null; true",
    );
    let started: u32 = out(&r).trim().parse().unwrap_or(0);
    assert!(
        started < 12,
        "{started} processes started under a limit of 12: {r:?}"
    );
    // The record the reaper reads names this sandbox's init.
    let rec = std::fs::read_to_string(rt.run_dir().join("sbx").join(format!("{}.init", s.name())))
        .unwrap();
    assert!(rec.starts_with(&format!("{} ", s.init_pid())), "{rec}");
    let r = sh(&mut cloned, "echo alive");
    assert_eq!(out(&r), "alive\n");
}

/// The parent pid of `pid` (`/proc/<pid>/stat`), or `None` once it is gone.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether any process has `ppid` as its parent.
fn has_children(ppid: i32) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
            .is_some_and(|pid| parent_of(pid) == Some(ppid))
    })
}

/// What an idle sandbox's init holds, seen from the host: credentials, confinement and
/// signal state, environment, command line, and the kinds of its descriptors (numbers, inode
/// numbers and the sandbox's own name left out, sorted).
fn init_view(sb: &Sandbox) -> Vec<String> {
    let pid = sb.init_pid();
    let mut view = sandbox::testing::confinement_status(pid as u32);
    view.push(std::fs::read_to_string(format!("/proc/{pid}/environ")).unwrap());
    view.push(std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap());
    let mut fds: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|l| {
            let t = l
                .to_string_lossy()
                .replace(&format!("/{}", sb.name()), "/<name>");
            t.split_once(":[")
                .map_or(t.clone(), |(kind, _)| kind.to_string())
        })
        .collect();
    fds.sort();
    view.extend(fds);
    view
}

/// Whether the kernel randomizes where programs are mapped (else every `execve` places one
/// at the same address, and a forked init cannot be told from an exec'd one by it).
fn aslr() -> bool {
    // SAFETY: personality with 0xffffffff only reads this process's persona.
    let persona = unsafe { libc::personality(0xffff_ffff) };
    std::fs::read_to_string("/proc/sys/kernel/randomize_va_space").is_ok_and(|v| v.trim() != "0")
        && persona >= 0
        && persona & libc::ADDR_NO_RANDOMIZE == 0
}

/// The start address of `pid`'s first mapping of its program (randomized at each `execve`).
fn program_base(pid: i32) -> String {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find(|l| l.ends_with(&*exe.to_string_lossy()))
        .and_then(|l| l.split('-').next())
        .unwrap()
        .to_string()
}

/// Spares are forked by the reserve's fork server, not exec'd: the forker is the init program
/// started with `--forker`, a child of this process with no child of its own (`CLONE_PARENT`
/// makes each init this process's child), and a spare's program sits where the forker's does
/// (an exec'd init's is placed anew). Such a spare's init starts as an exec'd one does (its
/// credentials, capabilities, confinement, signal state, environment, command line and kinds
/// of descriptors, compared with a cloned sandbox's exec'd init once both ran a command), and
/// holds nothing of the engine's memory. With forked spares off, spares are exec'd again.
#[test]
fn a_spare_forked_by_the_forker_starts_as_an_execd_init_does() {
    require_root!();
    // In this process's memory only: the forker is a program of its own, not a copy of us.
    let secret = format!("ef-spare-secret-{}-{}", std::process::id(), rt_tag());
    let rt = runtime();
    let mut cloned = rt.create(&config()).unwrap();
    let mut second = rt.create(&config()).unwrap();
    sh(&mut second, "true");
    let mut s = from_a_spare(&rt, &config());
    let me = std::process::id() as i32;
    let forker = rt.init_forker_pid().expect("no init forker runs");
    assert_eq!(parent_of(forker), Some(me));
    assert_eq!(
        parent_of(s.init_pid()),
        Some(me),
        "a spare is this process's child"
    );
    assert!(!has_children(forker), "the forker has a child");
    let cmdline = std::fs::read_to_string(format!("/proc/{forker}/cmdline")).unwrap();
    assert!(cmdline.ends_with("\0--forker\0"), "{cmdline:?}");
    if aslr() {
        assert_eq!(
            program_base(s.init_pid()),
            program_base(forker),
            "the spare was exec'd"
        );
    }
    sh(&mut s, "true");
    sh(&mut cloned, "true");
    assert_eq!(init_view(&s), init_view(&cloned));
    assert!(init_view(&s).contains(&"PATH=/usr/sbin:/usr/bin:/sbin:/bin\0".to_string()));
    assert!(sandbox::testing::memory_holds(me as u32, secret.as_bytes()));
    assert!(!sandbox::testing::memory_holds(
        s.init_pid() as u32,
        secret.as_bytes()
    ));
    assert!(!sandbox::testing::memory_holds(
        forker as u32,
        secret.as_bytes()
    ));
    assert_eq!(out(&sh(&mut s, "echo ok")), "ok\n");
    // Off: the next spares are exec'd (placed anew), the forker left as it is.
    if !aslr() {
        return;
    }
    assert_ne!(program_base(cloned.init_pid()), program_base(forker));
    rt.set_forked_spares(false);
    let mut keep = Vec::new();
    let execd = (0..20).find_map(|_| {
        let mut sb = from_a_spare(&rt, &config());
        let base = program_base(sb.init_pid());
        // Its first answer lets the reserve start the next spare.
        sh(&mut sb, "true");
        keep.push(sb);
        (base != program_base(forker)).then_some(())
    });
    assert!(execd.is_some(), "spares were still forked");
}

fn rt_tag() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
}

/// Take spares (each sandbox runs a command, which lets the reserve start the next) until the
/// reserve runs a forker other than `first`: its pid.
fn with_a_new_forker(rt: &Runtime, first: i32, keep: &mut Vec<Sandbox>) -> i32 {
    for _ in 0..20 {
        let mut sb = from_a_spare(rt, &config());
        assert_eq!(out(&sh(&mut sb, "echo ok")), "ok\n");
        keep.push(sb);
        if let Some(p) = rt.init_forker_pid().filter(|p| *p != first) {
            return p;
        }
    }
    panic!("no new forker was started");
}

/// A forker killed from outside is never asked again (it is reaped) and a later spare starts a
/// new one; every sandbox works throughout, and no forker outlives its runtime.
#[test]
fn a_killed_forker_is_replaced_and_none_outlives_its_runtime() {
    require_root!();
    let (rt, mut keep) = with_two_spares();
    let first = rt.init_forker_pid().expect("no init forker runs");
    // SAFETY: kill with integer arguments; the pid is this runtime's forker, our child, not
    // yet reaped.
    assert_eq!(unsafe { libc::kill(first, libc::SIGKILL) }, 0);
    let second = with_a_new_forker(&rt, first, &mut keep);
    assert_eq!(parent_of(second), Some(std::process::id() as i32));
    // The first one was reaped (no zombie left).
    let me = Some(std::process::id() as i32);
    assert_ne!(parent_of(first), me);
    drop((keep, rt));
    assert_ne!(parent_of(second), me, "the forker outlived its runtime");
}

/// A forker that stops answering (here stopped with SIGSTOP) fails the spare asked of it after
/// the answer's timeout: it is killed and reaped, the reserve counts a failure and starts a new
/// forker for a later spare, and the sandboxes work throughout.
#[test]
fn a_stopped_forker_is_killed_and_replaced() {
    require_root!();
    let (rt, mut keep) = with_two_spares();
    let first = rt.init_forker_pid().expect("no init forker runs");
    let failures = rt.spare_init_failures();
    // SAFETY: kill with integer arguments; the runtime's forker, our child, not reaped.
    assert_eq!(unsafe { libc::kill(first, libc::SIGSTOP) }, 0);
    with_a_new_forker(&rt, first, &mut keep);
    assert!(rt.spare_init_failures() > failures);
    assert_ne!(
        parent_of(first),
        Some(std::process::id() as i32),
        "the stopped forker was not reaped"
    );
}

/// An init program that does not act as a forker (here a wrapper that drops its arguments, as
/// an older `envfactory-init` named by `ENVFACTORY_INIT` would ignore `--forker` and wait for
/// its plan) is killed after the hello's timeout and that spare is exec'd (three such starts in
/// a row, and it is not started as a forker again): the reserve fills and its sandboxes work.
#[test]
fn a_program_that_is_not_a_forker_gets_its_spares_execd() {
    require_root!();
    let real = std::path::PathBuf::from(env!("CARGO_BIN_EXE_sandbox-init"));
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("init-without-arguments");
    std::fs::write(&wrapper, format!("#!/bin/sh\nexec {}\n", real.display())).unwrap();
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let rt = {
        let _starting = crate::common::serial(&crate::common::RUNTIME_START);
        sandbox::testing::runtime_with(sandbox::InitProgram::at(wrapper, vec![]).unwrap())
    };
    let mut keep = [rt.create(&config()).unwrap(), rt.create(&config()).unwrap()];
    sh(&mut keep[1], "true");
    assert!(
        eventually(30, || rt.spare_inits_ready() >= 2),
        "the reserve did not fill: {} failures",
        rt.spare_init_failures()
    );
    assert_eq!(rt.init_forker_pid(), None);
    let me = std::process::id() as i32;
    for pid in rt.spare_init_pids() {
        assert_eq!(parent_of(pid), Some(me));
    }
    let mut s = from_a_spare(&rt, &config());
    assert_eq!(out(&sh(&mut s, "echo ok")), "ok\n");
}

/// The reaper's records (path, `"<pid> <start time>"`) of the inits `pids`.
fn records_of(rt: &Runtime, pids: &[i32]) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(rt.run_dir().join("sbx"))
        .unwrap()
        .flatten()
    {
        if e.path().extension().is_some_and(|x| x == "init") {
            let rec = std::fs::read_to_string(e.path()).unwrap();
            let pid: i32 = rec.split_whitespace().next().unwrap().parse().unwrap();
            if pids.contains(&pid) {
                out.push((e.path(), rec));
            }
        }
    }
    assert_eq!(
        out.len(),
        pids.len(),
        "a spare without its record: {out:?} {pids:?}"
    );
    out
}

/// A runtime whose reserve holds two spares: the first sandbox clones its init, the second
/// starts the reserve (and may take a spare already; its replacement starts once it answered
/// a request).
fn with_two_spares() -> (Runtime, Vec<Sandbox>) {
    let rt = runtime();
    let a = rt.create(&config()).unwrap();
    let mut b = rt.create(&config()).unwrap();
    sh(&mut b, "true");
    assert!(
        eventually(10, || rt.spare_inits_ready() >= 2),
        "the reserve did not fill"
    );
    (rt, vec![a, b])
}

/// A tmpfs mounted in the host namespace for the test's life, unmounted even on panic.
struct TmpMount(std::path::PathBuf);

impl TmpMount {
    /// A 1 MiB tmpfs mounted on a new directory `name` in the temporary directory.
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let m = TmpMount(dir);
        nix::mount::mount(
            Some("tmpfs"),
            &m.0,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=1m"),
        )
        .unwrap();
        m
    }
}

impl Drop for TmpMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_init_started_before_the_engines_mount_table_changed_is_never_used() {
    require_root!();
    let (rt, _keep) = with_two_spares();
    let spares = rt.spare_init_pids();
    assert_eq!(spares.len(), 2, "{spares:?}");
    let records = records_of(&rt, &spares);
    // A layer on a filesystem mounted after those inits were cloned: their copies of the mount
    // table have the empty directory under it.
    let m = TmpMount::new("envfactory-spare");
    let dir = m.0.clone();
    std::fs::create_dir(dir.join("layer")).unwrap();
    std::fs::write(dir.join("layer/marker"), "mounted after\n").unwrap();
    let discarded_before = rt.spare_inits_used().1;
    let mut cfg = config();
    cfg.layers = vec![dir.join("layer")];
    let mut s = rt.create(&cfg).unwrap();
    let r = sh(&mut s, "cat /marker");
    assert_eq!(out(&r), "mounted after\n", "{r:?}");
    // Oldest first: both went before any newer spare could be used.
    assert!(
        rt.spare_inits_used().1 >= discarded_before + 2,
        "the stale spares were not discarded: {:?}",
        rt.spare_inits_used()
    );
    // Discarded means killed and reaped, with their records, directories and cgroups gone.
    for (rec_path, rec) in records {
        assert_eq!(
            sandbox::state::is_alive(&rec),
            None,
            "spare init {rec} still runs"
        );
        assert!(!rec_path.exists(), "{} left", rec_path.display());
        let dir = rec_path.with_extension("");
        assert!(!dir.exists(), "{} left", dir.display());
        for root in rt.cgroup_roots() {
            let cg = root
                .join("envfactory")
                .join(rt.run_id())
                .join(dir.file_name().unwrap());
            assert!(!cg.exists(), "{} left", cg.display());
        }
    }
}

#[test]
fn no_spare_init_outlives_its_runtime() {
    require_root!();
    let (rt, keep) = with_two_spares();
    let spares = records_of(&rt, &rt.spare_init_pids());
    assert_eq!(spares.len(), 2, "{spares:?}");
    let forker = rt.init_forker_pid().expect("no init forker runs");
    let run_dir = rt.run_dir().to_path_buf();
    drop((keep, rt));
    assert_ne!(
        parent_of(forker),
        Some(std::process::id() as i32),
        "the init forker outlived its runtime"
    );
    for (_, rec) in spares {
        // The same process (pid and start time) is gone.
        assert_eq!(
            sandbox::state::is_alive(&rec),
            None,
            "spare init {rec} outlived its runtime"
        );
    }
    assert!(!run_dir.exists(), "{} left", run_dir.display());
}

#[test]
fn a_spare_init_killed_from_outside_is_never_used() {
    require_root!();
    let (rt, _keep) = with_two_spares();
    // Kill every spare (as the OOM killer or an administrator might).
    let pids = rt.spare_init_pids();
    assert_eq!(pids.len(), 2);
    for pid in &pids {
        // SAFETY: kill with integer arguments; the pid is a spare init of this runtime, its
        // child, not yet reaped.
        assert_eq!(unsafe { libc::kill(*pid, libc::SIGKILL) }, 0);
    }
    // Taken once the kernel has made them zombies (one that dies between its check and its
    // plan fails its setup, and the create is made again with a cloned init).
    let zombie = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.rsplit_once(") ").is_some_and(|(_, r)| r.starts_with('Z')))
            .unwrap_or(false)
    };
    assert!(eventually(10, || pids.iter().all(|p| zombie(*p))));
    let discarded = rt.spare_inits_used().1;
    let mut s = rt.create(&config()).unwrap();
    assert_eq!(out(&sh(&mut s, "echo ok")), "ok\n");
    assert!(
        rt.spare_inits_used().1 >= discarded + 2,
        "{:?}",
        rt.spare_inits_used()
    );
}

/// A copy of this crate's init program beside it, removed when dropped (by a panic too).
struct InitCopy(std::path::PathBuf);

impl Drop for InitCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(self.0.with_extension("away"));
    }
}

/// A spare that cannot be started (here its init program gone for a while; in production
/// `EAGAIN` at a pids limit) is tried again after a pause: once the program is back, the
/// reserve fills again and a sandbox gets a spare. (Before, one failure stopped the reserve
/// for good.)
#[test]
fn the_reserve_fills_again_after_inits_failed_to_start() {
    require_root!();
    let real = std::path::PathBuf::from(env!("CARGO_BIN_EXE_sandbox-init"));
    let copy = InitCopy(real.with_file_name(format!("sandbox-init-retry-{}", std::process::id())));
    std::fs::copy(&real, &copy.0).unwrap();
    let rt = {
        let _starting = crate::common::serial(&crate::common::RUNTIME_START);
        sandbox::testing::runtime_with(sandbox::InitProgram::at(copy.0.clone(), vec![]).unwrap())
    };
    let mut keep = vec![rt.create(&config()).unwrap(), rt.create(&config()).unwrap()];
    sh(&mut keep[1], "true");
    assert!(
        eventually(10, || rt.spare_inits_ready() >= 2),
        "the reserve did not fill"
    );
    // The program gone: the spares are taken (a create whose spare was stale clones its
    // init and fails, which is fine here) and their replacements fail to start.
    std::fs::rename(&copy.0, copy.0.with_extension("away")).unwrap();
    // The forker runs on without its program: gone too, spares cannot be forked either.
    if let Some(forker) = rt.init_forker_pid() {
        // SAFETY: kill with integer arguments; the runtime's forker, our child, not reaped.
        unsafe { libc::kill(forker, libc::SIGKILL) };
    }
    let failures = rt.spare_init_failures();
    for _ in 0..20 {
        if let Ok(mut s) = rt.create(&config()) {
            sh(&mut s, "true");
            keep.push(s);
        }
        if eventually(1, || rt.spare_init_failures() > failures) {
            break;
        }
    }
    assert!(
        rt.spare_init_failures() > failures,
        "no spare failed to start: {}",
        rt.spare_inits_ready()
    );
    // Back: the reserve fills again, and a sandbox gets a spare.
    std::fs::rename(copy.0.with_extension("away"), &copy.0).unwrap();
    assert!(
        eventually(10, || rt.spare_inits_ready() >= 2),
        "the reserve did not fill again after {} failures",
        rt.spare_init_failures()
    );
    let mut s = from_a_spare(&rt, &config());
    assert_eq!(out(&sh(&mut s, "echo ok")), "ok\n");
}

/// Create sandboxes of `cfg` from spares until one keeps the root its spare made ahead (the
/// spares waiting may have been made for an earlier plan); `None` after `tries`.
fn keeping_a_root(rt: &Runtime, cfg: &sandbox::SandboxConfig, tries: usize) -> Option<Sandbox> {
    for _ in 0..tries {
        let kept = rt.spare_roots_kept();
        let mut sb = from_a_spare(rt, cfg);
        // Its first request lets the reserve start the next spare, for this plan.
        sh(&mut sb, "true");
        if rt.spare_roots_kept() > kept {
            return Some(sb);
        }
    }
    None
}

#[test]
fn a_spare_keeps_the_root_it_made_ahead_only_for_a_plan_with_the_same_root() {
    require_root!();
    let rt = runtime();
    let cloned = rt.create(&config()).unwrap();
    // The reserve starts at the second create, with the first's plan expected.
    drop(rt.create(&config()).unwrap());
    let mut cfg = config();
    cfg.hostname = "made-ahead".into();
    let mut s = keeping_a_root(&rt, &cfg, 4).expect("no spare kept the root it made ahead");
    // The host name is the plan's, not the one the root was made for; the rest as a cloned
    // sandbox has it.
    let probe = "hostname; ls / /dev; grep -E '^(Cap|Seccomp|NoNewPrivs)' /proc/self/status; \
                 awk '{print $5, $6}' /proc/self/mountinfo | sort; echo x > /root/f && cat /root/f";
    let (r, mut c) = (sh(&mut s, probe), cloned);
    let r0 = sh(&mut c, probe);
    assert_eq!(out(&r).lines().next(), Some("made-ahead"), "{r:?}");
    assert_eq!(
        out(&r).lines().skip(1).collect::<Vec<_>>(),
        out(&r0).lines().skip(1).collect::<Vec<_>>()
    );
    // A plan with another root (a path bound read-only) does not get the root made for the
    // last one: until a spare made for it comes (once two creates in a row had it), its spares
    // unmount theirs and mount its own.
    let mut ro = config();
    ro.readonly_paths = vec!["/opt".into()];
    let (kept, undone) = (rt.spare_roots_kept(), rt.spare_roots_undone());
    let mut first = from_a_spare(&rt, &ro);
    assert_eq!(
        rt.spare_roots_kept(),
        kept,
        "a root made for another plan was kept"
    );
    assert_eq!(
        rt.spare_roots_undone(),
        undone + 1,
        "no root made ahead was undone"
    );
    let r = sh(
        &mut first,
        "touch /opt/x 2>&1; echo $?; touch /root/y; echo $?",
    );
    assert_eq!(out(&r).lines().nth(1), Some("1"), "{r:?}");
    assert_eq!(out(&r).lines().nth(2), Some("0"), "{r:?}");
    drop(first);
    let mut later = keeping_a_root(&rt, &ro, 8).expect("no spare made the new plan's root ahead");
    let r = sh(
        &mut later,
        "touch /opt/x 2>&1; echo $?; ls /opt/x 2>&1; echo $?",
    );
    assert_eq!(out(&r).lines().nth(1), Some("1"), "{r:?}");
    assert_ne!(out(&r).lines().nth(3), Some("0"), "{r:?}");
    // And the plan before it gets its root back.
    let mut back = keeping_a_root(&rt, &config(), 8).expect("the first plan's root not made again");
    let r = sh(&mut back, "touch /opt/x; echo $?");
    assert_eq!(out(&r).trim(), "0", "{r:?}");
}

/// Hack trial: a spare mounted its root on the layer directories the plan named; a directory
/// put at a layer's path after that (the old one moved away) must be what the next sandbox
/// sees, though the plan names the same paths.
#[test]
fn a_layer_replaced_at_its_path_is_not_mistaken_for_the_one_mounted_ahead() {
    require_root!();
    // Layers must not lie in another layer (the host's root): on a tmpfs of the test's own.
    let m = TmpMount::new("envfactory-ahead");
    let dir = m.0.clone();
    let layer = dir.join("layer");
    std::fs::create_dir(&layer).unwrap();
    std::fs::write(layer.join("made-ahead-marker"), "one\n").unwrap();
    let mut cfg = config();
    cfg.layers = vec![layer.clone()];
    let rt = runtime();
    let mut a = rt.create(&cfg).unwrap();
    assert_eq!(out(&sh(&mut a, "cat /made-ahead-marker")), "one\n");
    drop(rt.create(&cfg).unwrap());
    // Spares made for this plan, with the first directory mounted.
    let mut b = keeping_a_root(&rt, &cfg, 4).expect("no spare kept the root it made ahead");
    assert_eq!(out(&sh(&mut b, "cat /made-ahead-marker")), "one\n");
    assert!(eventually(10, || rt.spare_inits_ready() >= 1 && rt.spare_inits_idle()));
    std::fs::rename(&layer, dir.join("old")).unwrap();
    std::fs::create_dir(&layer).unwrap();
    std::fs::write(layer.join("made-ahead-marker"), "two\n").unwrap();
    let (kept, undone) = (rt.spare_roots_kept(), rt.spare_roots_undone());
    let mut c = from_a_spare(&rt, &cfg);
    assert_eq!(
        rt.spare_roots_kept(),
        kept,
        "a root on the moved directory was kept"
    );
    assert_eq!(
        rt.spare_roots_undone(),
        undone + 1,
        "no root made ahead was undone"
    );
    assert_eq!(out(&sh(&mut c, "cat /made-ahead-marker")), "two\n");
}

#[test]
fn a_spare_that_cannot_make_the_expected_root_waits_without_it() {
    require_root!();
    let m = TmpMount::new("envfactory-gone");
    let layer = m.0.join("layer");
    std::fs::create_dir(&layer).unwrap();
    let mut cfg = config();
    cfg.layers = vec![layer.clone()];
    let rt = runtime();
    drop(rt.create(&cfg).unwrap());
    // The reserve starts at the second create.
    drop(rt.create(&cfg).unwrap());
    drop(keeping_a_root(&rt, &cfg, 4).expect("no spare kept the root it made ahead"));
    assert!(eventually(10, || rt.spare_inits_ready() >= 2 && rt.spare_inits_idle()));
    // The expected plan's layer goes: its create fails (taking a spare), and the spare started
    // in its place cannot make that root.
    std::fs::remove_dir(&layer).unwrap();
    let failures = rt.spare_init_failures();
    assert!(rt.create(&cfg).is_err());
    assert!(
        eventually(10, || rt.spare_inits_ready() >= 2 && rt.spare_inits_idle()),
        "the reserve did not fill again"
    );
    assert_eq!(
        rt.spare_init_failures(),
        failures,
        "a spare failed to start"
    );
    // Both spares serve another plan: the one made ahead undoes its root, the other has none.
    let undone = rt.spare_roots_undone();
    for _ in 0..2 {
        let before = rt.spare_inits_used().0;
        let mut sb = rt.create(&config()).unwrap();
        assert_eq!(rt.spare_inits_used().0, before + 1, "no spare was used");
        assert_eq!(out(&sh(&mut sb, "echo ok")), "ok\n");
    }
    assert_eq!(rt.spare_roots_undone(), undone + 1);
}
