//! A one-shot's sandbox init, forked from `engine sandbox exec`'s single thread, starts as an
//! exec'd `envfactory-init` does: seen from the host, and from the commands.

use sandbox::testing::{is_root, memory_holds};
use std::process::Command;

fn engine() -> Command {
    Command::new(env!("CARGO_BIN_EXE_engine"))
}

/// What a sandbox's init starts with, seen from the host while its command runs.
#[derive(Debug, PartialEq)]
struct InitView {
    /// Lines of `/proc/<init>/status` that describe credentials, confinement and signals.
    status: Vec<String>,
    environ: String,
    /// The command line, trailing NULs cut.
    cmdline: String,
    /// What each descriptor is, numbers and inode numbers left out, sorted.
    fds: Vec<String>,
    /// Whether any readable mapping of init holds the engine's secret variable.
    secret_in_memory: bool,
    /// The debug log's `forked=` of the sandbox.
    forked: bool,
}

fn processes_with_parent(ppid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let rest = stat.rsplit_once(')').unwrap().1;
        if rest.split_whitespace().nth(1) == Some(&ppid.to_string()) {
            out.push(pid);
        }
    }
    out
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The engine, killed (SIGKILL: its sandbox's init then ends when its control socket closes)
/// if the test fails before it is waited for.
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// [`look_at_init_once`] until the one-shot made its sandbox once: a one-shot makes it again,
/// with an exec'd init, when the host changed while its first one was set up (tests running
/// beside this one change files the host mask covers), and then there is no forked init to
/// look at.
fn look_at_init(exec_init: bool, secret: &str) -> InitView {
    for _ in 0..10 {
        let (view, log) = look_at_init_once(exec_init, secret);
        if !log.contains(sandbox::runtime::MADE_AGAIN_HOST_CHANGED) {
            return view;
        }
    }
    panic!("the one-shot's sandbox was made again in 10 tries in a row: the host kept changing");
}

/// Run `engine sandbox exec -- sleep 60` (init exec'd from envfactory-init with `exec_init`,
/// else forked), with a secret variable and an inherited descriptor (fd 9, a pipe without
/// close-on-exec), look at its init while `sleep` runs, then stop it with SIGTERM. The view
/// and the engine's log.
fn look_at_init_once(exec_init: bool, secret: &str) -> (InitView, String) {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let (_r, w) = nix::unistd::pipe().unwrap();
    let w_fd = w.as_raw_fd();
    let inherited = format!(
        "pipe:[{}]",
        nix::sys::stat::fstat(w.as_raw_fd()).unwrap().st_ino
    );
    let mut c = engine();
    c.args([
        "--log",
        "sandbox=debug",
        "sandbox",
        "exec",
        "--timeout",
        "60s",
        "--",
        "sleep",
        "60",
    ])
    .env("EF_TEST_SECRET", secret)
    .env_remove("ENVFACTORY_INIT")
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::piped());
    if exec_init {
        c.env("ENVFACTORY_INIT", env!("CARGO_BIN_EXE_envfactory-init"));
    }
    // SAFETY: dup2 is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        c.pre_exec(move || {
            if libc::dup2(w_fd, 9) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = KillOnDrop(Some(c.spawn().unwrap()));
    let engine_pid = child.0.as_ref().map_or(0, |c| c.id());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let init = loop {
        let found = processes_with_parent(engine_pid).into_iter().find(|&p| {
            comm(p) == "envfactory-init"
                && processes_with_parent(p).iter().any(|&q| comm(q) == "sleep")
        });
        if let Some(p) = found {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no init running sleep"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let status = std::fs::read_to_string(format!("/proc/{init}/status")).unwrap();
    let nspid = status.lines().find(|l| l.starts_with("NSpid:")).unwrap();
    assert!(
        nspid.ends_with("\t1"),
        "init is PID 1 of its namespace: {nspid}"
    );
    let status = sandbox::testing::confinement_status(init);
    for ns in ["mnt", "pid", "net", "uts", "ipc", "cgroup"] {
        let of = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/{ns}")).unwrap();
        assert_ne!(of(init), of(engine_pid), "init's {ns} namespace is its own");
    }
    let environ = std::fs::read_to_string(format!("/proc/{init}/environ")).unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{init}/cmdline")).unwrap();
    // Init's descriptors once they hold still (init opens and closes pipes around starting
    // the command; a snapshot taken in between would count the in-between ones).
    let read_fds = || {
        let links: Vec<String> = std::fs::read_dir(format!("/proc/{init}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.path()).ok())
            .map(|l| l.to_string_lossy().into_owned())
            .collect();
        let mut fds: Vec<String> = links
            .iter()
            .map(|t| {
                // `socket:[123]` -> `socket`; run and sandbox directories differ by run id.
                match t.split_once(":[") {
                    Some((kind, _)) => kind.to_string(),
                    None if t.starts_with("anon_inode:") => t.to_string(),
                    None => match t.find("/runs/") {
                        Some(i) => {
                            let in_run = t[i + 6..].split_once('/').map_or("", |x| x.1);
                            format!("<run>/{in_run}")
                        }
                        None => t.to_string(),
                    },
                }
            })
            .collect();
        fds.sort();
        (links, fds)
    };
    let mut last = read_fds();
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let now = read_fds();
        if now.1 == last.1 {
            break;
        }
        last = now;
    }
    let (links, fds) = last;
    assert!(
        !links.contains(&inherited),
        "init holds the descriptor the engine inherited: {links:?}"
    );
    let secret_in_memory = memory_holds(init, secret.as_bytes());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(engine_pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = child.0.take().unwrap().wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(143), "{o:?}");
    let log = String::from_utf8_lossy(&o.stderr)
        .replace("\x1b[0m", "")
        .replace("\x1b[2m", "")
        .replace("\x1b[3m", "");
    // Killed by the engine's teardown; a zombie until the host's PID 1 reaps it.
    let gone = || {
        std::fs::read_to_string(format!("/proc/{init}/stat")).map_or(true, |st| {
            comm(init) != "envfactory-init"
                || st
                    .rsplit_once(')')
                    .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
    };
    let t = std::time::Instant::now();
    while !gone() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(10),
            "init still runs after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let view = InitView {
        status,
        environ,
        cmdline: cmdline.trim_end_matches('\0').to_string(),
        fds,
        secret_in_memory,
        forked: log.contains("forked=true"),
    };
    (view, log)
}

/// `engine sandbox exec` forks its sandbox's init from its own single thread instead of
/// exec'ing `envfactory-init` (`sandbox/src/spawn_init.rs`). Seen from the host, the forked
/// init starts as the exec'd one does: the same credentials, capabilities, confinement,
/// signal mask and dispositions, environment (`PATH` only), command line and kinds of
/// descriptors, PID 1 of namespaces of its own, and neither holds the engine's environment
/// (a secret variable is nowhere in its memory) or a descriptor the engine inherited.
#[test]
fn a_one_shots_forked_init_starts_as_an_execd_init_does() {
    if !is_root() {
        return;
    }
    let secret = format!("ef-secret-{}-{:x}", std::process::id(), rand_tag());
    let forked = look_at_init(false, &secret);
    let execd = look_at_init(true, &secret);
    assert!(forked.forked, "{forked:?}");
    assert!(!execd.forked, "{execd:?}");
    assert!(!forked.secret_in_memory && !execd.secret_in_memory);
    assert_eq!(forked.environ, "PATH=/usr/sbin:/usr/bin:/sbin:/bin\0");
    assert_eq!(
        InitView {
            forked: true,
            ..execd
        },
        forked
    );
}

fn rand_tag() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

/// What a command sees of init is the same whether init was forked (a one-shot) or exec'd:
/// its memory, maps, environment and program stay closed; its status and command line read
/// the same.
#[test]
fn commands_see_a_forked_init_as_an_execd_one() {
    if !is_root() {
        return;
    }
    let script = "for f in environ maps mem exe fd/3; do cat /proc/1/$f >/dev/null 2>&1 && echo \"$f open\" || echo \"$f closed\"; done; \
                  tr '\\0' ' ' </proc/1/cmdline | sed 's/ *$//'; echo; grep -E '^(Name|Uid|Sig(Blk|Ign|Cgt)|CapEff|NoNewPrivs)' /proc/1/status";
    let run = |exec_init: bool| {
        let mut c = engine();
        c.env_remove("ENVFACTORY_INIT")
            .args(["sandbox", "exec", "--", "sh", "-c", script]);
        if exec_init {
            c.env("ENVFACTORY_INIT", env!("CARGO_BIN_EXE_envfactory-init"));
        }
        let o = c.output().unwrap();
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).unwrap()
    };
    let forked = run(false);
    assert!(
        forked.starts_with("environ closed\nmaps closed\nmem closed\nexe closed\nfd/3 closed\n"),
        "{forked}"
    );
    assert_eq!(forked, run(true));
}
