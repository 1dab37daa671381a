//! Debian suites as root filesystems (`--rootfs debootstrap:SUITE`): a minimal Debian system
//! (`debootstrap --variant=minbase`, what the `debian:SUITE` images hold) made once from the
//! Debian archive into `<state>/debootstrap/SUITE-ARCH/`, then used in place as a read-only
//! layer, as a directory rootfs is.
//!
//! A build holds a lock per suite, as does every process it starts (another builder waits,
//! then finds it made), runs in `SUITE-ARCH.partial/` and becomes the suite's directory by one
//! rename, after it is flushed and its digest written: a build that failed, was stopped or
//! timed out is never used, and the next one removes what it left. `debootstrap` runs as root
//! on the host, in mount, UTS, IPC and PID namespaces of its own, and dies with the engine
//! (the `/proc` and `/sys` it mounts in the new system, and every process it starts, end with
//! it); what it installs is checked against the Debian archive's keyring (the `Release`
//! file's signature and every package's hash), and the packages' maintainer scripts run
//! chrooted into the new system, as any Debian install runs them. docs/sandbox.md has the
//! rest.

use std::io::{Read, Seek};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where the packages come from unless `ENVFACTORY_DEBIAN_MIRROR` names another mirror (HTTPS:
/// the signature proves the packages are Debian's, not that the index is current, and a
/// plain-HTTP path could replay an old, validly signed one).
pub const DEFAULT_MIRROR: &str = "https://deb.debian.org/debian";
/// What the made system's `sources.list` names when it was made from [`DEFAULT_MIRROR`]: the
/// `debian` images' own source (their minimal system has no CA certificates for HTTPS).
const IMAGE_SOURCE: &str = "http://deb.debian.org/debian";
/// Debian's archive keyring, which `--force-check-gpg` needs.
const KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";
/// The CA certificates wget checks an HTTPS mirror with (Debian's `ca-certificates`).
const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Overrides [`DEFAULT_MIRROR`] (an `http://` or `https://` URL of a Debian mirror).
pub const MIRROR_ENV: &str = "ENVFACTORY_DEBIAN_MIRROR";
/// Overrides the program run (default `debootstrap`, looked up on `PATH`).
pub const PROGRAM_ENV: &str = "ENVFACTORY_DEBOOTSTRAP";
/// A build that takes longer is stopped (a stuck mirror must not hang a run forever).
const TIMEOUT: Duration = Duration::from_secs(20 * 60);
/// Lines of the build's log quoted in its error.
const TAIL_LINES: usize = 12;

/// Debian's release codenames with their numbers (`debian:13` is `debian:trixie`).
const RELEASES: &[(&str, u32)] = &[
    ("bullseye", 11),
    ("bookworm", 12),
    ("trixie", 13),
    ("forky", 14),
    ("duke", 15),
];
/// Suite names that follow the releases.
const ALIASES: &[&str] = &["oldstable", "stable", "testing", "unstable", "sid"];

#[derive(Debug, thiserror::Error)]
pub enum DebootstrapError {
    #[error("`{}` is not a Debian suite: expected one of {}, {} or a release number 11-15", crate::text_pos::cut(.0), RELEASES.iter().map(|r| r.0).collect::<Vec<_>>().join(", "), ALIASES.join(", "))]
    BadSuite(String),
    #[error("`{0}` is not a mirror URL (expected http:// or https://, no spaces)")]
    BadMirror(String),
    #[error("this machine's architecture `{0}` has no Debian name known here")]
    Arch(&'static str),
    #[error("`{program}` is missing ({source}); a Debian suite is made with debootstrap, wget, util-linux's unshare, gpgv, debian-archive-keyring and (for an HTTPS mirror) ca-certificates")]
    NotInstalled {
        program: String,
        source: std::io::Error,
    },
    #[error("state directory {0}: a path with characters other than letters, digits and `/._+-` cannot be handed to debootstrap (its shell would read them) or to overlayfs")]
    BadStatePath(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("debootstrap of `{suite}` from {mirror} failed ({status}); the end of its log ({log}):\n{tail}")]
    Failed {
        suite: String,
        mirror: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("debootstrap of `{suite}` from {mirror} ran past {} s and was stopped", .limit.as_secs())]
    TimedOut {
        suite: String,
        mirror: String,
        limit: Duration,
    },
    #[error("the debootstrapped `{suite}` in {path}: {source}")]
    Digest {
        suite: String,
        path: PathBuf,
        source: Box<crate::layers::LayerError>,
    },
    #[error("the debootstrapped `{suite}`: {path} is a symbolic link or under one; not followed")]
    Link { suite: String, path: PathBuf },
}

fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> DebootstrapError {
    let path = path.to_path_buf();
    move |source| DebootstrapError::Io { what, path, source }
}

/// A Debian suite by the name debootstrap takes: a codename (`trixie`) or an alias (`stable`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Suite(String);

impl Suite {
    /// A codename, an alias or a release number (`13` is `trixie`).
    pub fn parse(s: &str) -> Result<Self, DebootstrapError> {
        if let Some((name, _)) = RELEASES.iter().find(|(name, _)| *name == s) {
            return Ok(Self((*name).into()));
        }
        if ALIASES.contains(&s) {
            return Ok(Self(s.into()));
        }
        let number = s.split_once('.').map_or(s, |(major, _)| major);
        let minor_ok = s.split_once('.').is_none_or(|(_, minor)| {
            !minor.is_empty() && minor.bytes().all(|b| b.is_ascii_digit())
        });
        if let (Ok(n), true) = (number.parse::<u32>(), minor_ok) {
            if let Some((name, _)) = RELEASES.iter().find(|(_, v)| *v == n) {
                return Ok(Self((*name).into()));
            }
        }
        Err(DebootstrapError::BadSuite(s.into()))
    }

    /// The suite of a `debian` image's tag, as Docker Hub names them: `trixie`, `trixie-slim`,
    /// `13`, `13.2-slim`, `bookworm-20240110`, `stable-slim`, `latest` (stable). `None` for any
    /// other tag (`bookworm-backports`, `experimental`, ...): not a plain suite.
    pub fn of_debian_tag(tag: &str) -> Option<Self> {
        if tag == "latest" {
            return Some(Self("stable".into()));
        }
        let mut parts = tag.split('-');
        let suite = Self::parse(parts.next()?).ok()?;
        let plain =
            parts.all(|p| p == "slim" || (p.len() == 8 && p.bytes().all(|b| b.is_ascii_digit())));
        plain.then_some(suite)
    }

    /// The suite's name as debootstrap takes it.
    pub fn name(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Suite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// This host's own Debian suite (`VERSION_CODENAME` of `/etc/os-release` on Debian), if any.
pub fn host_suite() -> Option<Suite> {
    let text = std::fs::read_to_string("/etc/os-release").ok()?;
    let field = |key: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
    };
    if field("ID")? != "debian" {
        return None;
    }
    Suite::parse(&field("VERSION_CODENAME")?).ok()
}

/// The mirror builds use: [`MIRROR_ENV`] if set, else [`DEFAULT_MIRROR`].
pub fn mirror() -> Result<String, DebootstrapError> {
    mirror_of(std::env::var(MIRROR_ENV).ok())
}

fn mirror_of(set: Option<String>) -> Result<String, DebootstrapError> {
    let m = set.unwrap_or_else(|| DEFAULT_MIRROR.into());
    let ok = (m.starts_with("http://") || m.starts_with("https://"))
        && m.len() > "https://".len()
        && !m.chars().any(|c| c.is_whitespace() || c.is_control());
    if ok {
        Ok(m.trim_end_matches('/').to_string())
    } else {
        Err(DebootstrapError::BadMirror(m))
    }
}

/// Debian's name of this machine's architecture.
pub fn arch() -> Result<&'static str, DebootstrapError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok("amd64"),
        "aarch64" => Ok("arm64"),
        "x86" => Ok("i386"),
        "riscv64" => Ok("riscv64"),
        "powerpc64" => Ok("ppc64el"),
        "s390x" => Ok("s390x"),
        other => Err(DebootstrapError::Arch(other)),
    }
}

/// A built suite: its root directory and its digest (made once, when it was built).
#[derive(Debug, Clone)]
pub struct Built {
    pub rootfs: PathBuf,
    pub digest: String,
}

/// Where a suite's builds live under the state directory.
struct Paths {
    done: PathBuf,
    partial: PathBuf,
    lock: PathBuf,
    /// The last build's output (kept: a failed build's directory is removed).
    log: PathBuf,
}

impl Paths {
    fn of(state: &Path, suite: &Suite) -> Result<Self, DebootstrapError> {
        let dir = state.join("debootstrap");
        let name = format!("{suite}-{}", arch()?);
        Ok(Self {
            done: dir.join(&name),
            partial: dir.join(format!("{name}.partial")),
            lock: dir.join(format!("{name}.lock")),
            log: dir.join(format!("{name}.log")),
        })
    }
}

/// The suite as built before, if it was (no lock taken: a finished build is only renamed in).
pub fn cached(state: &Path, suite: &Suite) -> Result<Option<Built>, DebootstrapError> {
    let paths = Paths::of(state, suite)?;
    read_built(&paths.done)
}

fn read_built(done: &Path) -> Result<Option<Built>, DebootstrapError> {
    match std::fs::read_to_string(done.join("digest")) {
        Ok(_) if !done.join("rootfs").is_dir() => Ok(None),
        Ok(digest) => Ok(Some(Built {
            rootfs: done.join("rootfs"),
            digest: digest.trim().to_string(),
        })),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("reading", done)(e)),
    }
}

/// The suite, built now (from [`mirror`], by [`PROGRAM_ENV`] or `debootstrap`) if it was not
/// before.
pub fn ensure(state: &Path, suite: &Suite) -> Result<Built, DebootstrapError> {
    // A suite made before needs none of the tools.
    if let Some(b) = cached(state, suite)? {
        return Ok(b);
    }
    Debootstrap::from_env()?.ensure(state, suite)
}

/// How suites are built: the program, the mirror and the time a build may take.
#[derive(Debug, Clone)]
pub struct Debootstrap {
    /// `debootstrap`, or a program taking its arguments.
    pub program: PathBuf,
    pub mirror: String,
    pub timeout: Duration,
}

impl Debootstrap {
    /// [`PROGRAM_ENV`] or `debootstrap` (on `PATH`, `/usr/sbin` or `/sbin`), [`mirror`], and
    /// a 20-minute limit.
    pub fn from_env() -> Result<Self, DebootstrapError> {
        let name = std::env::var(PROGRAM_ENV).unwrap_or_else(|_| "debootstrap".into());
        let missing = |program: String| DebootstrapError::NotInstalled {
            program,
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        arch()?;
        let program = find_program(&name).ok_or_else(|| missing(name))?;
        // debootstrap downloads with wget; HTTPS needs the CA certificates.
        for tool in ["unshare", "gpgv", "wget"] {
            find_program(tool).ok_or_else(|| missing(tool.into()))?;
        }
        let mirror = mirror()?;
        let mut files = vec![KEYRING];
        if mirror.starts_with("https://") {
            files.push(CA_BUNDLE);
        }
        if let Some(f) = files.into_iter().find(|f| !Path::new(f).is_file()) {
            return Err(missing(f.into()));
        }
        Ok(Self {
            program,
            mirror,
            timeout: TIMEOUT,
        })
    }

    /// The suite, built now if it was not before (see the module's documentation).
    pub fn ensure(&self, state: &Path, suite: &Suite) -> Result<Built, DebootstrapError> {
        let paths = Paths::of(state, suite)?;
        if let Some(b) = read_built(&paths.done)? {
            return Ok(b);
        }
        let plain = |b: u8| b.is_ascii_alphanumeric() || b"/._+-".contains(&b);
        if !state
            .as_os_str()
            .as_encoded_bytes()
            .iter()
            .all(|b| plain(*b))
        {
            return Err(DebootstrapError::BadStatePath(state.to_path_buf()));
        }
        let dir = paths.lock.parent().unwrap_or(state);
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&paths.lock)
            .map_err(io("opening", &paths.lock))?;
        // Blocks while another process builds the same suite; it holds the lock to the end.
        crate::mask_store::flock(&lock, libc::LOCK_EX).map_err(io("locking", &paths.lock))?;
        if let Some(b) = read_built(&paths.done)? {
            return Ok(b);
        }
        let started = Instant::now();
        // Under the lock, nothing but a finished build is kept: what a killed build left, and
        // a published directory without its digest or root (removed by hand, half).
        remove_partial(&paths.partial)?;
        remove_partial(&paths.done)?;
        let built = self.build(suite, &paths, &lock);
        if built.is_err() {
            let _ = remove_partial(&paths.partial);
        }
        let digest = built?;
        publish(&paths.partial, &paths.done)?;
        tracing::info!(suite = %suite, mirror = %self.mirror, seconds = started.elapsed().as_secs_f64(), digest = %digest, "debootstrapped");
        Ok(Built {
            rootfs: paths.done.join("rootfs"),
            digest,
        })
    }

    /// Run debootstrap into `partial/rootfs`, tidy what it leaves as the images do, and write the
    /// digest (last: a directory with a digest is a finished build).
    fn build(
        &self,
        suite: &Suite,
        paths: &Paths,
        lock: &std::fs::File,
    ) -> Result<String, DebootstrapError> {
        let mirror = self.mirror.as_str();
        let partial = &paths.partial;
        let root = partial.join("rootfs");
        std::fs::create_dir_all(&root).map_err(io("creating", &root))?;
        let log_path = &paths.log;
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(log_path)
            .map_err(io("creating", log_path))?;
        let out = log.try_clone().map_err(io("opening", log_path))?;
        let mut cmd = Command::new("unshare");
        // Its own mount namespace (what it mounts in the new system goes with it), PID
        // namespace (every process it starts dies with it, `--kill-child` when it is killed),
        // UTS and IPC namespaces (a package script that sets a host name sets its own).
        cmd.args([
            "--mount",
            "--propagation",
            "private",
            "--uts",
            "--ipc",
            "--pid",
            "--fork",
            "--kill-child",
            "--",
        ])
        .arg(&self.program)
        // Without a keyring to check the archive's signature: fail, never install unchecked.
        .arg("--force-check-gpg")
        .arg("--variant=minbase")
        .arg(format!("--arch={}", arch()?))
        .arg(suite.name())
        .arg(&root)
        .arg(mirror);
        // An older debootstrap knows no script for a newer suite: sid's fits every current one.
        let scripts = Path::new("/usr/share/debootstrap/scripts");
        let system = self.program.file_name().is_some_and(|n| n == "debootstrap");
        if system && scripts.is_dir() && !scripts.join(suite.name()).exists() {
            cmd.arg(scripts.join("sid"));
        }
        let lock_fd = lock.as_raw_fd();
        let parent = std::process::id() as libc::pid_t;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(log.try_clone().map_err(io("opening", log_path))?)
            .process_group(0);
        // SAFETY: only async-signal-safe calls (prctl, fcntl, getppid) between fork and exec. The build
        // dies with the thread that waits for it (an engine stopped by a signal or a crash
        // takes it along: `unshare --kill-child` then ends the namespace), and every process
        // of it holds the suite's lock (the lock's descriptor is inherited, not closed at
        // exec), so no other build starts while one of them still writes.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                    || libc::fcntl(lock_fd, libc::F_SETFD, 0) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                // The engine died before the death signal was asked for: nothing would come.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
        tracing::info!(suite = %suite, mirror, root = %root.display(), "debootstrap: building the suite once");
        let mut child = cmd
            .spawn()
            .map_err(|source| DebootstrapError::NotInstalled {
                program: "unshare".into(),
                source,
            })?;
        let started = Instant::now();
        let stop = |child: &mut std::process::Child| {
            // SAFETY: signalling the process group this build started (its own group).
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
        };
        let status = loop {
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) if started.elapsed() > self.timeout => {
                    stop(&mut child);
                    return Err(DebootstrapError::TimedOut {
                        suite: suite.to_string(),
                        mirror: mirror.into(),
                        limit: self.timeout,
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => {
                    stop(&mut child);
                    return Err(io("waiting for debootstrap in", partial)(e));
                }
            }
        };
        if !status.success() {
            let mut tail = tail_of(&mut log);
            // debootstrap's own detailed log, kept in the new system when it fails.
            if let Ok(mut inner) = std::fs::File::open(root.join("debootstrap/debootstrap.log")) {
                tail = format!(
                    "{tail}\n[debootstrap/debootstrap.log]\n{}",
                    tail_of(&mut inner)
                );
            }
            return Err(DebootstrapError::Failed {
                suite: suite.to_string(),
                mirror: mirror.into(),
                status: status.to_string(),
                log: log_path.clone(),
                tail,
            });
        }
        tidy(suite, &root, (mirror == DEFAULT_MIRROR).then_some(mirror))?;
        let digest = digest(suite, mirror, &root).map_err(|e| DebootstrapError::Digest {
            suite: suite.to_string(),
            path: root.clone(),
            source: Box::new(e),
        })?;
        let digest_path = partial.join("digest");
        std::fs::write(&digest_path, format!("{digest}\n")).map_err(io("writing", &digest_path))?;
        Ok(digest)
    }
}

/// Flush the build (once published it is trusted) and rename it into place, never over
/// another.
fn publish(partial: &Path, done: &Path) -> Result<(), DebootstrapError> {
    let dir = std::fs::File::open(partial).map_err(io("opening", partial))?;
    nix::unistd::syncfs(dir.as_raw_fd()).map_err(|e| io("flushing", partial)(e.into()))?;
    match crate::sys::rename_noreplace(partial, done) {
        // A filesystem without RENAME_NOREPLACE (NFS, some FUSE): the lock is held and no
        // suite is there (removed under it), so a plain rename replaces nothing.
        Err(nix::errno::Errno::EINVAL | nix::errno::Errno::ENOSYS) => {
            std::fs::rename(partial, done)
        }
        r => r.map_err(std::io::Error::from),
    }
    .map_err(io("publishing", done))
}

fn remove_partial(partial: &Path) -> Result<(), DebootstrapError> {
    match std::fs::remove_dir_all(partial) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("removing an unfinished build", partial)(e)),
    }
}

/// Why a suite cannot be made here (a tool or the keyring missing, a bad mirror), if it can't.
pub fn unavailable() -> Option<DebootstrapError> {
    Debootstrap::from_env().err()
}

/// A program by path, or its executable file on `PATH`.
fn find_program(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return runnable(&p).then_some(p);
    }
    // debootstrap lives in /usr/sbin, which a user's PATH may leave out.
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| runnable(p))
}

/// The last [`TAIL_LINES`] lines of a log.
fn tail_of(f: &mut std::fs::File) -> String {
    let len = f.seek(std::io::SeekFrom::End(0)).unwrap_or(0);
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(64 << 10)));
    let mut bytes = Vec::new();
    let _ = f.read_to_end(&mut bytes);
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

/// What the `debian` images leave out: the downloaded packages and package lists (a build
/// step runs `apt-get update` first, as it must there), the contents of `/dev`, and this
/// host's name and resolver; made from the default mirror, the image's own `sources.list`
/// (`http://deb.debian.org`). Never through a symbolic link the packages made: a directory
/// that is one or lies under one is refused.
fn tidy(suite: &Suite, root: &Path, image_source: Option<&str>) -> Result<(), DebootstrapError> {
    // `rel` under the root, each of its components checked not to be a link.
    let dir = |rel: &str| -> Result<PathBuf, DebootstrapError> {
        let mut p = root.to_path_buf();
        for part in Path::new(rel).components() {
            p.push(part);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(DebootstrapError::Link {
                    suite: suite.to_string(),
                    path: p,
                });
            }
        }
        Ok(p)
    };
    for (rel, keep) in [
        ("var/cache/apt/archives", &["partial", "lock"][..]),
        ("var/lib/apt/lists", &["partial", "lock"][..]),
        // Device nodes and links debootstrap made: a sandbox (and a container) mounts its
        // own /dev there, and an image layer may not hold devices.
        ("dev", &[][..]),
    ] {
        let Ok(entries) = std::fs::read_dir(dir(rel)?) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            if keep.iter().any(|k| e.file_name() == *k) {
                continue;
            }
            let p = e.path();
            let r = if e.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            r.map_err(io("removing", &p))?;
        }
    }
    if let Some(mirror) = image_source {
        let sources = dir("etc/apt")?.join("sources.list");
        if std::fs::symlink_metadata(&sources).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(DebootstrapError::Link {
                suite: suite.to_string(),
                path: sources,
            });
        }
        if let Ok(text) = std::fs::read_to_string(&sources) {
            let _ = std::fs::remove_file(&sources);
            std::fs::write(&sources, text.replace(mirror, IMAGE_SOURCE))
                .map_err(io("writing", &sources))?;
        }
    }
    let etc = dir("etc")?;
    for (file, text) in [("resolv.conf", ""), ("hostname", "localhost\n")] {
        let p = etc.join(file);
        // The file itself is replaced (a link there is removed, not followed).
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, text).map_err(io("writing", &p))?;
    }
    Ok(())
}

/// The suite's digest: how it was made and what it holds (names, modes, owners, sizes, times).
fn digest(suite: &Suite, mirror: &str, root: &Path) -> Result<String, crate::layers::LayerError> {
    use sha2::{Digest, Sha256};
    let tree = crate::layers::dir_digest(root)?;
    let mut h = Sha256::new();
    h.update(
        format!(
            "envfactory-debootstrap-v1\n{suite} {} minbase {mirror}\n{tree}\n",
            arch().unwrap_or("?")
        )
        .as_bytes(),
    );
    Ok(format!("sha256-{}", hex::encode(h.finalize())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suites_parse_from_names_numbers_and_image_tags() {
        assert_eq!(Suite::parse("trixie").unwrap().name(), "trixie");
        assert_eq!(Suite::parse("13").unwrap().name(), "trixie");
        assert_eq!(Suite::parse("12.5").unwrap().name(), "bookworm");
        assert_eq!(Suite::parse("sid").unwrap().name(), "sid");
        for bad in [
            "", "Trixie", "10", "13.", "13.x", "buster", "../etc", "trixie ",
        ] {
            let e = Suite::parse(bad).unwrap_err().to_string();
            assert!(e.contains("is not a Debian suite"), "{bad}: {e}");
        }
        let tag = |t: &str| Suite::of_debian_tag(t).map(|s| s.name().to_string());
        assert_eq!(tag("trixie-slim").as_deref(), Some("trixie"));
        assert_eq!(tag("13.2-slim").as_deref(), Some("trixie"));
        assert_eq!(tag("bookworm-20240110-slim").as_deref(), Some("bookworm"));
        assert_eq!(tag("latest").as_deref(), Some("stable"));
        assert_eq!(tag("stable-slim").as_deref(), Some("stable"));
        for other in [
            "bookworm-backports",
            "experimental",
            "rc-buggy",
            "trixie-2024",
            "",
        ] {
            assert_eq!(tag(other), None, "{other}");
        }
    }

    #[test]
    fn a_mirror_must_be_an_http_url() {
        for (m, ok) in [
            ("http://deb.debian.org/debian/", true),
            ("https://mirror.example/debian", true),
            ("ftp://x/debian", false),
            ("http://a b/debian", false),
            ("https://", false),
        ] {
            assert_eq!(mirror_of(Some(m.into())).is_ok(), ok, "{m}");
        }
        assert_eq!(mirror_of(None).unwrap(), DEFAULT_MIRROR);
        assert_eq!(
            mirror_of(Some("http://m/debian/".into())).unwrap(),
            "http://m/debian"
        );
    }
}
