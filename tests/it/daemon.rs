//! `engine sandbox daemon`: a one-shot it serves answers as the engine itself would, in a
//! sandbox of its own; only the same binary with the same environment is served; a client
//! that goes away has its command killed; the host mask follows the host as a new process's
//! would; a daemon killed outright leaves one-shots working.

use crate::common;
use common::{spawn, TempState};
use sandbox::testing::eventually;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A daemon over a private state directory (its socket `<state>/exec.sock`, where the
/// one-shots of [`Daemon::client`] look), its log in a file; stopped with SIGTERM on drop.
struct Daemon {
    child: Option<Child>,
    log: PathBuf,
    state: TempState,
    _logdir: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Self {
        Self::start_from(Path::new(env!("CARGO_BIN_EXE_engine")))
    }

    /// A daemon of the `engine` front at `engine` (its engine program beside it).
    fn start_from(engine: &Path) -> Self {
        let state = TempState::new();
        let logdir = tempfile::tempdir().unwrap();
        let log = logdir.path().join("daemon.log");
        let child = spawn(
            Command::new(engine)
                .env("ENVFACTORY_STATE", state.path())
                .env_remove("ENVFACTORY_INIT")
                .args(["--log", "engine=debug", "sandbox", "daemon"])
                .stdin(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap()),
        );
        let d = Self {
            child: Some(child),
            log,
            state,
            _logdir: logdir,
        };
        d.wait_listening();
        d
    }

    fn wait_listening(&self) {
        let t = Instant::now();
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "the daemon did not listen: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn socket(&self) -> PathBuf {
        self.state.path().join("exec.sock")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// One-shots the daemon has served so far (its debug log says each).
    fn served(&self) -> usize {
        self.log_text().matches("one-shot served").count()
    }

    /// The program `engine` over the daemon's state directory, with none of the one-shot's
    /// variables of this process.
    fn command(&self, engine: &Path) -> Command {
        let mut c = Command::new(engine);
        c.env("ENVFACTORY_STATE", self.state.path())
            .env_remove("ENVFACTORY_INIT")
            .env_remove("ENVFACTORY_EXEC_SOCKET")
            .env_remove("ENVFACTORY_LOG");
        c
    }

    /// `engine sandbox exec` over the daemon's state directory.
    fn client(&self) -> Command {
        let mut c = self.command(Path::new(env!("CARGO_BIN_EXE_engine")));
        c.args(["sandbox", "exec"]);
        c
    }

    /// The same, which must be served by this daemon (`ENVFACTORY_EXEC_SOCKET`).
    fn strict(&self) -> Command {
        let mut c = self.client();
        c.env("ENVFACTORY_EXEC_SOCKET", self.socket());
        c
    }

    fn kill(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill(libc::SIGTERM);
        // What a daemon killed outright left (its run's inits, cgroups, directory).
        let _ = Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", self.state.path())
            .arg("reap")
            .stdout(Stdio::null())
            .status();
    }
}

/// A child process killed (SIGTERM, then SIGKILL) and reaped when dropped.
struct Guard(Option<Child>);

impl Guard {
    fn wait_deadline(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let c = self.0.as_mut()?;
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(secs) {
            if let Ok(Some(st)) = c.try_wait() {
                self.0 = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    fn signal(&self, sig: i32) {
        if let Some(c) = &self.0 {
            // SAFETY: a signal to our own child, not yet reaped.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            if !eventually(10, || c.try_wait().is_ok_and(|s| s.is_some())) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Copies of the `engine` front, the engine program and the init program in `dir`; the
/// front's path.
fn copy_engine(dir: &Path) -> PathBuf {
    for bin in [
        env!("CARGO_BIN_EXE_engine"),
        env!("CARGO_BIN_EXE_engine-core"),
        env!("CARGO_BIN_EXE_envfactory-init"),
    ] {
        let bin = Path::new(bin);
        let copy = dir.join(bin.file_name().unwrap());
        std::fs::copy(bin, &copy).unwrap();
        // Run once (through `spawn`: again while "text busy"), so that no later exec of it
        // (the front's hand-over, the daemon's inits) can meet a write handle another
        // thread's fork still holds.
        spawn(
            Command::new(&copy)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .wait()
        .unwrap();
    }
    dir.join("engine")
}

/// The one-shot failed as the engine's own failure (125), saying `why`.
fn failed(o: &Output, why: &str) {
    let (code, _, err) = answer(o);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains(why), "{err}");
}

/// Exit status, stdout and stderr.
fn answer(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn one_shots_served_by_the_daemon_answer_as_the_engine_would_each_in_a_fresh_sandbox() {
    require_root!();
    let d = Daemon::start();
    // Served: every way a command ends, each answered as the engine itself answers.
    let served_cases: [&[&str]; 6] = [
        &["--", "sh", "-c", "echo out; echo err >&2; exit 3"],
        &["--", "/nonexistent/program"],
        &["--", "/etc/passwd"],
        &["--timeout", "1s", "--", "sleep", "5"],
        &["--", "sh", "-c", "kill -9 $$"],
        &[
            "--memory",
            "24M",
            "--",
            "sh",
            "-c",
            "x=$(head -c 200000000 /dev/zero | tr '\\0' a)",
        ],
    ];
    for args in served_cases {
        let own = d.client().arg("--no-daemon").args(args).output().unwrap();
        let before = d.served();
        let served = d.strict().args(args).output().unwrap();
        assert_eq!(answer(&served), answer(&own), "{args:?}");
        assert_eq!(d.served(), before + 1, "{args:?}: {}", d.log_text());
    }
    let codes: Vec<Option<i32>> = served_cases
        .iter()
        .map(|args| d.strict().args(*args).output().unwrap().status.code())
        .collect();
    assert_eq!(
        codes,
        [
            Some(3),
            Some(127),
            Some(126),
            Some(124),
            Some(137),
            Some(137)
        ]
    );
    let oom = d.strict().args(served_cases[5]).output().unwrap();
    assert!(
        String::from_utf8_lossy(&oom.stderr).contains("out of memory (limit 24M)"),
        "{:?}",
        answer(&oom)
    );
    // Not served: options that do not parse (the client says so itself), and roots other
    // than the host's (resolved once per runtime, which a new process would not do).
    for args in [
        &["--rootfs", "/nonexistent/root", "--", "true"][..],
        &["--cpus", "2000", "--", "true"],
        &["--rootfs", "oci:/nonexistent/image.tar", "--", "true"],
    ] {
        let before = d.served();
        let own = d.client().arg("--no-daemon").args(args).output().unwrap();
        let asked = d.client().args(args).output().unwrap();
        assert_eq!(answer(&asked), answer(&own), "{args:?}");
        assert_eq!(d.served(), before, "{args:?}");
    }
    let o = d
        .strict()
        .args(["--rootfs", "oci:/nonexistent/image.tar", "--", "true"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("host-rooted sandboxes only"),
        "{:?}",
        answer(&o)
    );
    // Found in the state directory without naming it; every request gets a sandbox no
    // command has run in (the same configuration's is made ahead after each request).
    let probe = "test -e /tmp/mark && echo SEEN; touch /tmp/mark";
    let before = d.served();
    for _ in 0..3 {
        let o = d.client().args(["--", "sh", "-c", probe]).output().unwrap();
        let (code, out, err) = answer(&o);
        assert_eq!(code, Some(0), "{err}");
        assert!(!out.contains("SEEN"), "a sandbox served twice: {out}");
    }
    assert_eq!(d.served(), before + 3, "{}", d.log_text());
    let mode = std::fs::metadata(d.socket()).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        mode.permissions().mode() & 0o777,
        0o600,
        "the socket is root's only"
    );
}

#[test]
fn a_daemon_serves_only_its_own_binary_and_environment() {
    require_root!();
    let d = Daemon::start();
    // Another init program: the daemon would make another sandbox, so it does not serve.
    let init = env!("CARGO_BIN_EXE_envfactory-init");
    let before = d.served();
    let o = d
        .strict()
        .env("ENVFACTORY_INIT", init)
        .args(["--", "true"])
        .output()
        .unwrap();
    failed(&o, "ENVFACTORY_INIT differs");
    // Not named: the one-shot makes its sandbox itself.
    let o = d
        .client()
        .env("ENVFACTORY_INIT", init)
        .args(["--", "sh", "-c", "echo made here"])
        .output()
        .unwrap();
    assert_eq!(answer(&o).1, "made here\n", "{:?}", answer(&o));
    // A log filter asking for more than warnings: made here, so that its log shows how.
    let o = d
        .client()
        .args(["--log", "sandbox=debug", "--", "true"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("sandbox ready"),
        "{:?}",
        answer(&o)
    );
    assert_eq!(d.served(), before, "{}", d.log_text());
    // Another engine binary (a copy of the front and the engine program: another inode).
    let dir = tempfile::tempdir().unwrap();
    let copy = copy_engine(dir.path());
    let o = spawn(
        Command::new(&copy)
            .env("ENVFACTORY_STATE", d.state.path())
            .env("ENVFACTORY_EXEC_SOCKET", d.socket())
            .env_remove("ENVFACTORY_INIT")
            .args(["sandbox", "exec", "--", "true"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .wait_with_output()
    .unwrap();
    failed(&o, "another engine binary");
    assert_eq!(d.served(), before);
    // Not named, it makes its own sandbox, and a signal then tears that down as a one-shot
    // without a daemon does (the signal handling the wait for the daemon used is undone).
    let seconds = format!("{}.{}", 301, std::process::id());
    let argv = ["sleep", seconds.as_str()];
    let fallback = Guard(Some(spawn(
        Command::new(&copy)
            .env("ENVFACTORY_STATE", d.state.path())
            .env_remove("ENVFACTORY_EXEC_SOCKET")
            .env_remove("ENVFACTORY_INIT")
            .args(["sandbox", "exec", "--timeout", "600s", "--"])
            .args(argv)
            .stderr(Stdio::null()),
    )));
    assert!(
        eventually(20, || !processes_running(&argv).is_empty()),
        "the command runs"
    );
    fallback.signal(libc::SIGINT);
    let mut fallback = fallback;
    assert_eq!(fallback.wait_deadline(20).and_then(|s| s.code()), Some(130));
    assert!(
        processes_running(&argv).is_empty(),
        "torn down before the one-shot exits"
    );
    // A client in another mount namespace, or with other resource limits, would get a
    // sandbox made in the daemon's world: not served.
    let o = Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            env!("CARGO_BIN_EXE_engine"),
        ])
        .env("ENVFACTORY_STATE", d.state.path())
        .env("ENVFACTORY_EXEC_SOCKET", d.socket())
        .env_remove("ENVFACTORY_INIT")
        .args(["sandbox", "exec", "--", "true"])
        .output()
        .unwrap();
    failed(&o, "its mnt namespace");
    let o = Command::new("sh")
        .args([
            "-c",
            "ulimit -n 512 && exec \"$ENGINE\" sandbox exec -- true",
        ])
        .env("ENGINE", env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", d.state.path())
        .env("ENVFACTORY_EXEC_SOCKET", d.socket())
        .env_remove("ENVFACTORY_INIT")
        .output()
        .unwrap();
    failed(&o, "its resource limits");
    // Another state directory.
    let other = TempState::new();
    let o = d
        .strict()
        .env("ENVFACTORY_STATE", other.path())
        .args(["--", "true"])
        .output()
        .unwrap();
    failed(&o, "another state directory");
    // A bad admission setting is bad input whoever would make the sandbox.
    let o = d
        .strict()
        .env("ENVFACTORY_MAX_SANDBOXES", "0")
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(answer(&o).0, Some(2), "{:?}", answer(&o));
    assert_eq!(d.served(), before, "{}", d.log_text());
    // The daemon's own state directory spelled through a symlink is the same state: served.
    let link = dir.path().join("state-link");
    std::os::unix::fs::symlink(d.state.path(), &link).unwrap();
    let o = d
        .strict()
        .env("ENVFACTORY_STATE", &link)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(answer(&o).0, Some(0), "{:?}", answer(&o));
    assert_eq!(d.served(), before + 1, "{}", d.log_text());
    // A relative state directory is the client's, not the daemon's: the relative spelling
    // of the daemon's state from the daemon's directory (this test's), given by a client in
    // another directory, names another one there.
    let rel: PathBuf = std::env::current_dir()
        .unwrap()
        .components()
        .skip(1)
        .map(|_| "..")
        .collect::<PathBuf>()
        .join(d.state.path().strip_prefix("/").unwrap());
    let elsewhere = dir.path().join("a/b");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let o = d
        .strict()
        .current_dir(&elsewhere)
        .env("ENVFACTORY_STATE", &rel)
        .args(["--", "true"])
        .output()
        .unwrap();
    failed(&o, "another state directory");
    assert_eq!(d.served(), before + 1, "{}", d.log_text());
    // A daemon does not start with a cap on one process's sandboxes.
    let capped_log = dir.path().join("capped.log");
    let mut capped = Guard(Some(spawn(
        Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", other.path())
            .env("ENVFACTORY_MAX_SANDBOXES", "4")
            .args(["sandbox", "daemon"])
            .stderr(std::fs::File::create(&capped_log).unwrap()),
    )));
    let status = capped.wait_deadline(20);
    let err = std::fs::read_to_string(&capped_log).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("ENVFACTORY_MAX_SANDBOXES"), "{err}");
    // One daemon per socket.
    let errlog = dir.path().join("second.log");
    let mut second = Guard(Some(spawn(
        Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", d.state.path())
            .args(["sandbox", "daemon"])
            .stderr(std::fs::File::create(&errlog).unwrap()),
    )));
    let status = second.wait_deadline(20);
    let err = std::fs::read_to_string(&errlog).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{err}");
    assert!(err.contains("a daemon already listens there"), "{err}");
}

/// Processes of the host whose command line is exactly `argv`.
fn processes_running(argv: &[&str]) -> Vec<u32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

#[test]
fn a_one_shots_command_dies_with_its_client() {
    require_root!();
    let d = Daemon::start();
    let seconds = format!("{}.{}", 300, std::process::id());
    let argv = ["sleep", seconds.as_str()];
    let mut client = d
        .strict()
        .args(["--timeout", "600s", "--"])
        .args(argv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(20, || !processes_running(&argv).is_empty()),
        "the command runs"
    );
    // SAFETY: a signal to our own child, not yet reaped.
    unsafe { libc::kill(client.id() as i32, libc::SIGKILL) };
    let _ = client.wait();
    assert!(
        eventually(20, || { processes_running(&argv).is_empty() }),
        "the command is killed with its client"
    );
    // A signal the client handles: it exits 128 + the signal, and the command goes too.
    let mut client = Guard(Some(
        d.strict()
            .args(["--timeout", "600s", "--"])
            .args(argv)
            .spawn()
            .unwrap(),
    ));
    assert!(
        eventually(20, || !processes_running(&argv).is_empty()),
        "the command runs"
    );
    client.signal(libc::SIGINT);
    assert_eq!(client.wait_deadline(20).and_then(|s| s.code()), Some(130));
    assert!(
        eventually(20, || { processes_running(&argv).is_empty() }),
        "the command is killed with its client"
    );
    // A process the command leaves in the background is gone before the answer comes.
    let seconds = format!("{}.{}", 302, std::process::id());
    let argv = ["sleep", seconds.as_str()];
    let o = d
        .strict()
        .args(["--", "sh", "-c", &format!("sleep {seconds} & echo left")])
        .output()
        .unwrap();
    assert_eq!(answer(&o).1, "left\n", "{:?}", answer(&o));
    assert!(processes_running(&argv).is_empty(), "outlived its answer");
    // The daemon goes on serving.
    assert!(d.strict().args(["--", "true"]).status().unwrap().success());
}

/// As `an_etc_file_made_private_after_the_walk_was_remembered_is_hidden` (the sandbox
/// crate's attack tests) for a long-lived daemon: a file of `/etc` made private after the
/// daemon's mask was made is hidden from the one-shots it serves a second later, as it is
/// from a new process's, though the daemon had a sandbox made ahead with the old mask.
#[test]
fn a_file_of_etc_made_private_is_hidden_from_the_daemons_next_one_shots() {
    require_root!();
    struct Remove(PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    use std::os::unix::fs::PermissionsExt;
    let name = format!("envfactory-daemon-canary-{}", std::process::id());
    let canary = Remove(Path::new("/etc").join(&name));
    std::fs::write(&canary.0, "secret").unwrap();
    std::fs::set_permissions(&canary.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    let d = Daemon::start();
    let read = format!("cat /etc/{name} 2>&1; true");
    let out = |c: &mut Command| answer(&c.args(["--", "sh", "-c", &read]).output().unwrap()).1;
    assert_eq!(out(&mut d.strict()), "secret", "world-readable: seen");
    std::fs::set_permissions(&canary.0, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::thread::sleep(Duration::from_millis(1300));
    let served = out(&mut d.strict());
    assert!(
        !served.contains("secret") && served.contains("No such file"),
        "{served}"
    );
    assert_eq!(served, out(d.client().arg("--no-daemon")));
    assert!(
        d.log_text().contains("the host changed"),
        "{}",
        d.log_text()
    );
}

#[test]
fn a_daemon_killed_outright_leaves_one_shots_working() {
    require_root!();
    let mut d = Daemon::start();
    assert!(d.strict().args(["--", "true"]).status().unwrap().success());
    d.kill(libc::SIGKILL);
    assert!(d.socket().exists(), "a SIGKILL leaves the socket");
    // Nothing listens: a one-shot makes its own sandbox; one that names the socket fails.
    let o = d
        .client()
        .args(["--", "sh", "-c", "echo ok"])
        .output()
        .unwrap();
    assert_eq!(answer(&o).1, "ok\n", "{:?}", answer(&o));
    let o = d.strict().args(["--", "true"]).output().unwrap();
    failed(&o, "no daemon answers there");
    // A new daemon takes the stale socket's place; SIGTERM removes it.
    let mut again = Guard(Some(spawn(
        Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", d.state.path())
            .args(["sandbox", "daemon"])
            .stderr(Stdio::null()),
    )));
    assert!(
        eventually(20, || {
            std::os::unix::net::UnixStream::connect(d.socket()).is_ok()
        }),
        "a new daemon listens"
    );
    assert!(d.strict().args(["--", "true"]).status().unwrap().success());
    again.signal(libc::SIGTERM);
    assert_eq!(again.wait_deadline(20).and_then(|s| s.code()), Some(143));
    assert!(!d.socket().exists(), "the socket is removed on SIGTERM");
}

#[test]
fn the_front_serves_one_shots_itself_and_hands_every_other_command_to_the_engine_program() {
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let front = copy_engine(dir.path());
    let d = Daemon::start_from(&front);
    let one_shot = |args: &[&str]| {
        let mut c = d.command(&front);
        c.env("ENVFACTORY_EXEC_SOCKET", d.socket())
            .args(["sandbox", "exec"])
            .args(args);
        spawn(c.stdout(Stdio::piped()).stderr(Stdio::piped()))
            .wait_with_output()
            .unwrap()
    };
    let o = one_shot(&["--", "sh", "-c", "echo served; exit 4"]);
    assert_eq!(answer(&o), (Some(4), "served\n".into(), String::new()));
    let served = d.served();
    assert!(served >= 1, "{}", d.log_text());
    // The engine program made unrunnable (its identity, by which the daemon serves, is the
    // same): a served one-shot never needs it, anything else does.
    let core = dir.path().join("engine-core");
    let mode = |m: u32| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&core, std::fs::Permissions::from_mode(m)).unwrap();
    };
    mode(0o644);
    let o = one_shot(&["--", "sh", "-c", "echo alone"]);
    let served_alone = answer(&o);
    let no_daemon = answer(&one_shot(&["--no-daemon", "--", "true"]));
    let bad_input = answer(&one_shot(&["--memory", "lots", "--", "true"]));
    let verbose = answer(&one_shot(&["--log", "info", "--", "true"]));
    let version = Command::new(&front).arg("--version").output().unwrap();
    mode(0o755);
    assert_eq!(served_alone, (Some(0), "alone\n".into(), String::new()));
    assert_eq!(d.served(), served + 1, "{}", d.log_text());
    for (code, _, err) in [no_daemon, bad_input, verbose, answer(&version)] {
        assert_eq!(code, Some(125), "{err}");
        assert!(
            err.contains("cannot run the engine program") && err.contains("engine-core"),
            "{err}"
        );
    }
    // Handed over, the engine program answers as before: input errors in its words, help.
    let (code, _, err) = answer(&one_shot(&["--memory", "lots", "--", "true"]));
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--memory"), "{err}");
    let version = Command::new(&front).arg("--version").output().unwrap();
    assert!(
        answer(&version).1.starts_with("engine "),
        "{:?}",
        answer(&version)
    );
    // An engine program of another build refuses the front's command line.
    let o = Command::new(dir.path().join("engine-core"))
        .env("ENVFACTORY_FRONT_BUILD", "0123456789abcdef")
        .arg("--version")
        .output()
        .unwrap();
    let (code, out, err) = answer(&o);
    assert_eq!(code, Some(125), "{out}{err}");
    assert!(
        err.contains("from another build") && out.is_empty(),
        "{err}"
    );
    assert_eq!(d.served(), served + 1, "{}", d.log_text());
}

/// The static `engine` front (engine/front/Cargo.toml, musl), built by this test into
/// `target/static-front`; `None` when this toolchain has no musl target (`rustup target add
/// x86_64-unknown-linux-musl`; `.ci/run` adds it), after checking that the package compiles
/// for the host's target all the same.
fn static_front() -> Option<PathBuf> {
    let triple = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let Ok(sysroot) = Command::new(&rustc).args(["--print", "sysroot"]).output() else {
        eprintln!("skipped: no `{rustc}` to ask for its sysroot (set RUSTC)");
        return None;
    };
    let sysroot = String::from_utf8_lossy(&sysroot.stdout).trim().to_string();
    let has_musl = Path::new(&sysroot)
        .join("lib/rustlib")
        .join(&triple)
        .is_dir();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // target/debug/engine -> target
    let target = Path::new(env!("CARGO_BIN_EXE_engine"))
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("static-front");
    let mut c = Command::new(cargo);
    c.arg(if has_musl { "build" } else { "check" })
        .arg("--locked")
        .arg("--manifest-path")
        .arg(root.join("engine/front/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target);
    if has_musl {
        c.args(["--target", &triple]);
    }
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "building the static front: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    if !has_musl {
        eprintln!(
            "skipped: no {triple} target in {sysroot} (rustup target add {triple}); the static \
             front's package was only checked for the host's target"
        );
        return None;
    }
    Some(target.join(&triple).join("debug/engine"))
}

#[test]
fn the_static_front_answers_as_the_dynamic_one_and_hands_over_the_same() {
    // Built (or, without the musl target, checked) as any user, run as root.
    let Some(built) = static_front() else {
        return;
    };
    require_root!();
    let dir = tempfile::tempdir().unwrap();
    let dynamic = copy_engine(dir.path());
    let front = dir.path().join("engine-static");
    std::fs::copy(&built, &front).unwrap();
    use engine::bench::sandbox::{linkage, Linkage};
    let pie = |dynamic| Linkage {
        dynamic,
        position_independent: true,
    };
    assert_eq!(linkage(&dynamic).unwrap(), pie(true));
    // Position independent (its address randomized at each start), with no loader.
    assert_eq!(linkage(&front).unwrap(), pie(false), "{}", built.display());
    let d = Daemon::start_from(&dynamic);
    // `strict`: the one-shot must be served by this daemon. A front the daemon turns away hands
    // over to the engine program, which asks again and is served: the daemon's log (every
    // refusal is in it) tells, below.
    let run = |engine: &Path, args: &[&str], strict: bool| {
        let mut c = d.command(engine);
        c.args(args);
        if strict {
            c.env("ENVFACTORY_EXEC_SOCKET", d.socket());
        }
        spawn(c.stdout(Stdio::piped()).stderr(Stdio::piped()))
            .wait_with_output()
            .unwrap()
    };
    // The same build: the daemon serves it, and each answer is the dynamic front's.
    let build = |engine: &Path| run(engine, &["__front-build"], false).stdout;
    assert_eq!(build(&front), build(&dynamic));
    for args in [
        &[
            "sandbox",
            "exec",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ][..],
        &["sandbox", "exec", "--", "/nonexistent/program"],
        &["sandbox", "exec", "--timeout", "1s", "--", "sleep", "5"],
        &["sandbox", "exec", "--", "sh", "-c", "kill -9 $$"],
    ] {
        let before = d.served();
        let theirs = answer(&run(&dynamic, args, true));
        assert_eq!(d.served(), before + 1, "{args:?}: {}", d.log_text());
        let ours = answer(&run(&front, args, true));
        assert_eq!(ours, theirs, "{args:?}");
        assert_eq!(d.served(), before + 2, "{args:?}: {}", d.log_text());
    }
    assert!(
        !d.log_text().contains("not served"),
        "a front was refused: {}",
        d.log_text()
    );
    // Everything else is the engine program's, found beside the static front too.
    for args in [
        &["--version"][..],
        &["sandbox", "exec", "--memory", "lots", "--", "true"],
        &[
            "sandbox",
            "exec",
            "--no-daemon",
            "--",
            "sh",
            "-c",
            "echo own; exit 5",
        ],
    ] {
        let before = d.served();
        assert_eq!(
            answer(&run(&front, args, false)),
            answer(&run(&dynamic, args, false)),
            "{args:?}"
        );
        assert_eq!(d.served(), before, "{args:?}");
    }
}

/// The static front's package pins the workspace's versions (engine/front/Cargo.lock): both
/// fronts carry one build id (engine/build.rs digests both lock files), so the crates that
/// encode the wire (serde, rmp-serde) and everything else they share must be the same.
#[test]
fn the_static_fronts_lock_file_pins_the_workspaces_versions() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    type Entry = (String, String, Option<String>, Option<String>);
    let packages = |p: &Path| -> Vec<Entry> {
        let lock: toml::Table = std::fs::read_to_string(p).unwrap().parse().unwrap();
        lock["package"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let f = |k: &str| p.get(k).and_then(|v| v.as_str()).map(String::from);
                (
                    f("name").unwrap(),
                    f("version").unwrap(),
                    f("source"),
                    f("checksum"),
                )
            })
            .collect()
    };
    let workspace = packages(&root.join("Cargo.lock"));
    let front = packages(&root.join("engine/front/Cargo.lock"));
    let mut shared = 0;
    for entry @ (name, version, ..) in &front {
        if name == "engine-front" {
            continue;
        }
        assert!(
            workspace.contains(entry),
            "engine/front/Cargo.lock has {name} {version}, which Cargo.lock does not: \
             `cargo update --manifest-path engine/front/Cargo.toml -p {name} --precise VERSION` \
             to the workspace's"
        );
        shared += 1;
    }
    for wire in ["serde", "rmp-serde", "sandbox"] {
        assert!(front.iter().any(|(n, ..)| n == wire), "{wire}");
    }
    assert!(shared > 20, "{shared}");
}
