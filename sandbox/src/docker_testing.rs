//! Test support for the Docker parts (features `testing` and `docker`): one private Docker
//! daemon per test process, and small images imported from root filesystems built from host
//! binaries. Panics on failure, as a test should.
//!
//! [`daemon`] starts `dockerd` (with its own containerd) once, with its data root, exec root,
//! pid file and socket in a fresh directory, no bridge and no iptables rules, and waits until
//! it answers. A watcher shell started with it waits for the test process to exit (also by a
//! panic or abort), then stops that daemon by its PID and removes the directory: nothing is
//! left. Where no daemon can be started (no `dockerd`, not root), [`daemon`] says why and the
//! caller skips.

use crate::docker::Client;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A test process's private Docker daemon.
#[derive(Debug)]
pub struct Daemon {
    /// `unix://<dir>/docker.sock`.
    pub host: String,
    /// Its directory (data root, exec root, socket): removed after the test process exits.
    pub dir: PathBuf,
}

impl Daemon {
    pub fn client(&self) -> Client {
        Client::connect(&self.host).expect("connect to the test daemon")
    }

    /// `docker -H <this daemon> ARGS`, asserting success; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new("docker")
            .arg("-H")
            .arg(&self.host)
            .args(args)
            .output()
            .expect("run the docker CLI");
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Import `tar` (a root filesystem) as image `name` (`docker import`); its id.
    pub fn import(&self, tar: &Path, name: &str) -> String {
        self.cli(&["import", &tar.to_string_lossy(), name])
    }
}

static DAEMON: OnceLock<Result<Daemon, String>> = OnceLock::new();

/// The test process's daemon, started on first use; `Err(reason)` where none can be started.
pub fn daemon() -> Result<&'static Daemon, String> {
    DAEMON.get_or_init(start).as_ref().map_err(Clone::clone)
}

/// Skip the calling test (printing why) when no Docker daemon can be started; else the daemon.
#[macro_export]
macro_rules! require_docker {
    () => {
        match $crate::docker_testing::daemon() {
            Ok(d) => d,
            Err(why) => {
                eprintln!("skipped: no Docker engine: {why}");
                return;
            }
        }
    };
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

fn start() -> Result<Daemon, String> {
    if !crate::testing::is_root() {
        return Err("dockerd needs root".into());
    }
    let dockerd = which("dockerd").ok_or("no `dockerd` on PATH (apt-get install docker.io)")?;
    which("docker").ok_or("no `docker` CLI on PATH")?;
    let dir = tempfile::Builder::new()
        .prefix("envfactory-dockerd-")
        .tempdir_in("/tmp")
        .map_err(|e| format!("temp dir: {e}"))?
        .keep();
    let host = format!("unix://{}/docker.sock", dir.display());
    let d = dir.display();
    // The daemon and its watcher: when the test process (the watcher's parent) is gone, stop
    // the daemon by the PID it was started with, give it 20 s, then remove its directory.
    let script = format!(
        "parent=$PPID; {dockerd} --iptables=false --ip6tables=false --bridge=none \
         --data-root {d}/data --exec-root {d}/exec --pidfile {d}/docker.pid \
         -H {host} --containerd-namespace envfactory-test \
         --containerd-plugins-namespace envfactory-test-plugins >{d}/log 2>&1 & daemon=$!; \
         while kill -0 $parent 2>/dev/null; do sleep 0.5; done; \
         kill -TERM $daemon; i=0; while kill -0 $daemon 2>/dev/null && [ $i -lt 40 ]; do sleep 0.5; i=$((i+1)); done; \
         kill -KILL $daemon 2>/dev/null; wait $daemon; \
         for m in $(awk '{{print $5}}' /proc/self/mountinfo | grep '^{d}/' | sort -r); do umount -l \"$m\"; done; \
         rm -rf {d}",
        dockerd = dockerd.display(),
    );
    Command::new("/bin/sh")
        .arg("-c")
        .arg(script)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("starting dockerd: {e}"))?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        if Client::connect(&host).is_ok() {
            // `docker:IMAGE` root filesystems resolve through `DOCKER_HOST`: this daemon, for
            // every test of the process (set once, before any test can use it).
            std::env::set_var("DOCKER_HOST", &host);
            return Ok(Daemon { host, dir });
        }
        if Instant::now() > until {
            let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
            let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
            return Err(format!("dockerd did not answer within 60 s: {tail}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A tar of a small root filesystem made of host programs (each with the shared libraries
/// `ldd` names), `/etc/passwd` and `/etc/group`, the usual directories and the merged-`/usr`
/// links; `extra` are more host paths copied as they are (e.g. perl's library directory).
pub fn rootfs_tar(out: &Path, programs: &[&str], extra: &[&str]) {
    let root = tempfile::tempdir().expect("temp dir");
    let r = root.path();
    for d in [
        "usr/bin",
        "usr/sbin",
        "usr/lib",
        "usr/lib64",
        "etc",
        "tmp",
        "root",
        "proc",
        "dev",
        "sys",
        "run",
        "var/tmp",
    ] {
        std::fs::create_dir_all(r.join(d)).expect("mkdir");
    }
    for (l, t) in [
        ("bin", "usr/bin"),
        ("sbin", "usr/sbin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
    ] {
        std::os::unix::fs::symlink(t, r.join(l)).expect("symlink");
    }
    let mut paths: Vec<String> = Vec::new();
    for p in programs {
        let path = which(p).unwrap_or_else(|| panic!("no `{p}` on this host"));
        paths.push(path.to_string_lossy().into_owned());
        let ldd = Command::new("ldd").arg(&path).output().expect("ldd");
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            if let Some(lib) = line.split_whitespace().find(|w| w.starts_with('/')) {
                paths.push(lib.to_string());
            }
        }
    }
    paths.extend(extra.iter().map(|s| s.to_string()));
    paths.extend(["/etc/passwd".to_string(), "/etc/group".to_string()]);
    for p in &paths {
        // cp -a keeps links (a library's soname link and its target both come along).
        let real = Path::new(p).canonicalize().expect("canonicalize");
        for src in [Path::new(p), real.as_path()] {
            let rel = src.strip_prefix("/").expect("absolute");
            let rel = rel
                .strip_prefix("bin")
                .map(|x| Path::new("usr/bin").join(x))
                .unwrap_or(rel.to_path_buf());
            let rel = rel
                .strip_prefix("lib")
                .map(|x| Path::new("usr/lib").join(x))
                .unwrap_or(rel);
            let rel = rel
                .strip_prefix("lib64")
                .map(|x| Path::new("usr/lib64").join(x))
                .unwrap_or(rel);
            let dst = r.join(&rel);
            std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
            let ok = Command::new("cp")
                .args(["-a", "--no-dereference"])
                .arg(src)
                .arg(&dst)
                .status()
                .expect("cp");
            assert!(ok.success(), "cp {}", src.display());
        }
    }
    let ok = Command::new("tar")
        .arg("-C")
        .arg(r)
        .arg("-cf")
        .arg(out)
        .arg(".")
        .status()
        .expect("tar");
    assert!(ok.success(), "tar of the test rootfs");
}
