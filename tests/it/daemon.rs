//! `engine sandbox daemon`: a one-shot it serves answers as the engine itself would, in a
//! sandbox of its own; only the same binary with the same environment is served; a client
//! that goes away has its command killed; the host mask follows the host as a new process's
//! would; a daemon killed outright leaves one-shots working.

use crate::common;
use common::{is_root, TempState};
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
        let state = TempState::new();
        let logdir = tempfile::tempdir().unwrap();
        let log = logdir.path().join("daemon.log");
        let child = Command::new(env!("CARGO_BIN_EXE_engine"))
            .env("ENVFACTORY_STATE", state.path())
            .env_remove("ENVFACTORY_INIT")
            .args(["--log", "engine=debug", "sandbox", "daemon"])
            .stdin(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
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

    /// `engine sandbox exec` over the daemon's state directory.
    fn client(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_engine"));
        c.env("ENVFACTORY_STATE", self.state.path())
            .env_remove("ENVFACTORY_INIT")
            .env_remove("ENVFACTORY_EXEC_SOCKET")
            .env_remove("ENVFACTORY_LOG")
            .args(["sandbox", "exec"]);
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
    if !is_root() {
        return;
    }
    let d = Daemon::start();
    let cases: [&[&str]; 6] = [
        &["--", "sh", "-c", "echo out; echo err >&2; exit 3"],
        &["--", "/nonexistent/program"],
        &["--timeout", "1s", "--", "sleep", "5"],
        &["--", "sh", "-c", "kill -9 $$"],
        &["--rootfs", "/nonexistent/root", "--", "true"],
        &["--cpus", "2000", "--", "true"],
    ];
    for args in cases {
        let own = d.client().arg("--no-daemon").args(args).output().unwrap();
        let before = d.served();
        let served = d.strict().args(args).output().unwrap();
        assert_eq!(answer(&served), answer(&own), "{args:?}");
        // Options that do not parse never reach the daemon; the others were served there.
        let reached = !args.contains(&"/nonexistent/root") && !args.contains(&"2000");
        if reached {
            assert_eq!(d.served(), before + 1, "{args:?}: {}", d.log_text());
        }
    }
    // Found in the state directory without naming it; every request gets a sandbox no
    // command has run in (the same configuration's is made ahead after each request).
    let probe = "test -e /tmp/mark && echo SEEN; touch /tmp/mark; echo $$; hostname";
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
    if !is_root() {
        return;
    }
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
    let (code, _, err) = answer(&o);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("ENVFACTORY_INIT differs"), "{err}");
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
    // Another engine binary (a copy: another inode).
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("engine");
    std::fs::copy(env!("CARGO_BIN_EXE_engine"), &copy).unwrap();
    let o = Command::new(&copy)
        .env("ENVFACTORY_STATE", d.state.path())
        .env("ENVFACTORY_EXEC_SOCKET", d.socket())
        .env_remove("ENVFACTORY_INIT")
        .args(["sandbox", "exec", "--", "true"])
        .output()
        .unwrap();
    let (code, _, err) = answer(&o);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("another engine binary"), "{err}");
    assert_eq!(d.served(), before);
    // One daemon per socket.
    let o = Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", d.state.path())
        .args(["sandbox", "daemon"])
        .output()
        .unwrap();
    let (code, _, err) = answer(&o);
    assert_eq!(code, Some(2), "{err}");
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

fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(20), "{what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_one_shots_command_dies_with_its_client() {
    if !is_root() {
        return;
    }
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
    eventually("the command runs", || !processes_running(&argv).is_empty());
    // SAFETY: a signal to our own child, not yet reaped.
    unsafe { libc::kill(client.id() as i32, libc::SIGKILL) };
    let _ = client.wait();
    eventually("the command is killed with its client", || {
        processes_running(&argv).is_empty()
    });
    // A signal the client handles: it exits 128 + the signal, and the command goes too.
    let mut client = d
        .strict()
        .args(["--timeout", "600s", "--"])
        .args(argv)
        .spawn()
        .unwrap();
    eventually("the command runs", || !processes_running(&argv).is_empty());
    // SAFETY: as above.
    unsafe { libc::kill(client.id() as i32, libc::SIGINT) };
    assert_eq!(client.wait().unwrap().code(), Some(130));
    eventually("the command is killed with its client", || {
        processes_running(&argv).is_empty()
    });
    // The daemon goes on serving.
    assert!(d.strict().args(["--", "true"]).status().unwrap().success());
}

/// As `an_etc_file_made_private_after_the_walk_was_remembered_is_hidden` (the sandbox
/// crate's attack tests) for a long-lived daemon: a file of `/etc` made private after the
/// daemon's mask was made is hidden from the one-shots it serves a second later, as it is
/// from a new process's, though the daemon had a sandbox made ahead with the old mask.
#[test]
fn a_file_of_etc_made_private_is_hidden_from_the_daemons_next_one_shots() {
    if !is_root() {
        return;
    }
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
    if !is_root() {
        return;
    }
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
    let (code, _, err) = answer(&o);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("no daemon answers there"), "{err}");
    // A new daemon takes the stale socket's place; SIGTERM removes it.
    let mut again = Command::new(env!("CARGO_BIN_EXE_engine"))
        .env("ENVFACTORY_STATE", d.state.path())
        .args(["sandbox", "daemon"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("a new daemon listens", || {
        std::os::unix::net::UnixStream::connect(d.socket()).is_ok()
    });
    assert!(d.strict().args(["--", "true"]).status().unwrap().success());
    // SAFETY: a signal to our own child, not yet reaped.
    unsafe { libc::kill(again.id() as i32, libc::SIGTERM) };
    assert_eq!(again.wait().unwrap().code(), Some(143));
    assert!(!d.socket().exists(), "the socket is removed on SIGTERM");
}
