//! A task's Dockerfile built into read-only layers: each `RUN`, `COPY`/`ADD` and `WORKDIR`
//! runs in a build sandbox over the base and the layers before it (a `RUN` reaches the
//! package registries through the build network, `registries.rs`, and nothing else), and
//! its diff becomes a layer of the store, named by its cache key: the base's digest, the
//! build network, the instruction and everything before it (and the content of what `COPY`
//! reads). A layer
//! is published by rename only after its step succeeded: no half-built layer is ever used,
//! and a failed step leaves every earlier layer in place.

use super::dockerfile::{Dockerfile, Source, Step};
use super::registries::{BuildNetwork, RegistryProxy};
use super::{sbx_err, HarborError, Task};
use sandbox::debootstrap::{self, Suite};
use sandbox::{ExecRequest, RootfsSpec, Runtime, SandboxConfig};
use sha2::{Digest, Sha256};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The built environment of a task.
#[derive(Debug, Clone)]
pub struct Image {
    pub rootfs: RootfsSpec,
    /// Layers above the rootfs, topmost first.
    pub layers: Vec<PathBuf>,
    /// The rootfs's own lower directories (topmost first): with `layers`, the image as
    /// built, read by the verifier to restore what the tests run.
    pub base_lowers: Vec<PathBuf>,
    /// `ENV` (and `ARG`) of the image, in order.
    pub env: Vec<(String, String)>,
    /// `USER` as `(uid, gid)`; `None`: root.
    pub user: Option<(u32, u32)>,
    pub workdir: String,
    /// Layers built now, and found in the store.
    pub built: usize,
    pub cached: usize,
    /// How `FROM` was resolved (reported per task).
    pub base_note: String,
    /// What perturbations need beyond their layer (environment, limits, start steps).
    pub runtime: crate::instance::RuntimeSettings,
    /// The perturbations applied, in words.
    pub applied: Vec<String>,
}

/// How a task's image is built.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// The rootfs every `FROM` resolves to (`--base`); `None`: [`resolve_from`]'s order.
    pub base: Option<RootfsSpec>,
    /// How `RUN` steps reach the network (default: the package registries only).
    pub network: BuildNetwork,
}

impl BuildOptions {
    /// Every `FROM` on `base`, the default network.
    pub fn on(base: RootfsSpec) -> Self {
        Self {
            base: Some(base),
            ..Self::default()
        }
    }
}

/// The store of built layers: `<state>/harbor-layers`, its own tmpfs (overlayfs refuses a
/// layer nested in another layer's filesystem, and the `host` rootfs uses `/`).
#[derive(Debug, Clone)]
pub struct LayerStore {
    dir: PathBuf,
}

fn is_mountpoint(p: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

impl LayerStore {
    /// Open (mounting its tmpfs on first use) the store of a state directory; what a crashed
    /// build left (`.tmp-*`) is removed.
    pub fn open(state: &Path) -> Result<Self, HarborError> {
        let dir = state.join("harbor-layers");
        let ioe = |source| HarborError::Io {
            path: dir.clone(),
            source,
        };
        std::fs::create_dir_all(&dir).map_err(ioe)?;
        if !is_mountpoint(&dir) {
            nix::mount::mount(
                Some("envfactory-harbor"),
                &dir,
                Some("tmpfs"),
                nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                Some("mode=0755,size=8g"),
            )
            .map_err(|e| ioe(std::io::Error::from(e)))?;
        }
        for e in std::fs::read_dir(&dir).map_err(ioe)?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            // Only builds of processes that are gone: `.tmp-<key>-<pid>`.
            if let Some(pid) = n.strip_prefix(".tmp-").and_then(|r| r.rsplit('-').next()) {
                let alive = pid
                    .parse::<i32>()
                    .is_ok_and(|p| Path::new(&format!("/proc/{p}")).exists());
                if !alive {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(Self { dir })
    }

    /// Unmount the store of a state directory (`engine reap --cache`); whether one was there.
    pub fn remove(state: &Path) -> Result<bool, HarborError> {
        let dir = state.join("harbor-layers");
        if !is_mountpoint(&dir) {
            return Ok(false);
        }
        nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH).map_err(|e| {
            HarborError::Io {
                path: dir.clone(),
                source: e.into(),
            }
        })?;
        let _ = std::fs::remove_dir(&dir);
        Ok(true)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// An image name's repository: `python` of `docker.io/library/python:3.11-slim`.
fn repository(image: &str) -> &str {
    let name = image.rsplit('/').next().unwrap_or(image);
    name.split([':', '@']).next().unwrap_or(name)
}

/// Names that stand for a Debian or Ubuntu base: without a local image of that name, `FROM`
/// takes the `host` rootfs (this host's Debian system, read-only) instead.
fn is_debian_family(image: &str) -> bool {
    ["debian", "ubuntu", "python", "buildpack-deps"].contains(&repository(image))
}

/// What build steps get on top of the image's environment when `FROM` was substituted: a
/// `python` image's pip installs into its own `/usr/local`, where a Debian Python (the
/// host's, or a debootstrapped suite's) is marked externally managed (PEP 668) and refuses,
/// so its steps set `PIP_BREAK_SYSTEM_PACKAGES=1` (pip then installs into `/usr/local`, as
/// in that image).
fn substitution_env(rootfs: &RootfsSpec, from: &str) -> Vec<(String, String)> {
    let debian = matches!(rootfs, RootfsSpec::Host | RootfsSpec::Debootstrap(_));
    if debian && repository(from) == "python" {
        vec![("PIP_BREAK_SYSTEM_PACKAGES".into(), "1".into())]
    } else {
        Vec::new()
    }
}

/// An image name's tag (`latest` when it has none; a digest is dropped).
fn tag(image: &str) -> &str {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    last.split_once(':').map_or("latest", |(_, t)| t)
}

/// The Debian suite a `debian` image's name stands for (`debian:trixie-slim`, `debian:13`,
/// `debian` alone is `latest`, that is `stable`); `None` for other images and other tags.
fn debian_suite(image: &str) -> Option<Suite> {
    if repository(image) != "debian" {
        return None;
    }
    Suite::of_debian_tag(tag(image))
}

/// The Debian suites whose `python3` is a CPython minor version, oldest first (the order
/// [`python_base`] searches): `FROM python:3.13` without a local image is trixie with its own
/// `python3`.
const DEBIAN_PYTHONS: &[(&str, &str)] = &[
    ("3.9", "bullseye"),
    ("3.11", "bookworm"),
    ("3.13", "trixie"),
];

/// The Debian suite the `python` images are built on when their tag names none (Docker
/// Hub's default since August 2025).
const PYTHON_IMAGES_SUITE: &str = "trixie";

/// What a `python` image has that a minimal Debian system lacks, from the suite's own archive,
/// and pytest: the runner the offline shims call where a test script would download one
/// (`docs/harbor.md`, "Offline operation"), as the `host` base brings it.
const PYTHON_PACKAGES: &str = "python3 python3-pip python3-venv python-is-python3 python3-pytest";

/// What `FROM python:TAG` stands for without a local image: a Debian suite and the Python the
/// tag asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PythonBase {
    suite: Suite,
    /// `3.13` of `python:3.13.1-slim`; `None` for `python:slim`, `python:3`, `latest`.
    asked: Option<String>,
    /// Whether the suite's `python3` is the version asked for (known for [`DEBIAN_PYTHONS`]).
    matches: bool,
    /// The suite the tag names (`-bookworm`), when it is one made here.
    named: Option<Suite>,
}

/// A version's `(major, minor)`: `3.13` is `(3, 13)`.
fn minor_version(v: &str) -> Option<(u32, u32)> {
    let (major, minor) = v.split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The [`PythonBase`] of a `python` image's name (tags as Docker Hub names them: `3.13`,
/// `3.13.1-slim`, `3.12-slim-bookworm`, `3-bookworm`, `3.14-rc-slim`, `slim`, `latest`): the
/// suite whose `python3` is the minor version asked for; for a version no suite ships, the
/// suite the tag names if its Python is not older, else the oldest suite with a newer Python
/// of the same major version (the one that breaks the fewest programs written for the version
/// asked), else the newest suite of that major version, else the suite the tag names, else
/// the images' own default (also for a tag without a minor version). `None` for
/// other images and for the variants that are not Debian (`alpine`, `windowsservercore`,
/// `nanoserver`). Other words (`buster`: a suite not made here) name nothing.
fn python_base(image: &str) -> Option<PythonBase> {
    if repository(image) != "python" {
        return None;
    }
    let mut asked = None;
    let mut named = None;
    for (i, part) in tag(image).split('-').enumerate() {
        if ["alpine", "windowsservercore", "nanoserver"]
            .iter()
            .any(|v| part.starts_with(v))
        {
            return None;
        }
        if i == 0 && part.starts_with(|c: char| c.is_ascii_digit()) {
            let mut numbers = part.split('.');
            let major = numbers.next().unwrap_or_default();
            // `3.14.0rc1`: the minor version is what selects the suite.
            asked = numbers.next().and_then(|minor| {
                let digits: String = minor.chars().take_while(char::is_ascii_digit).collect();
                (!digits.is_empty()).then(|| format!("{major}.{digits}"))
            });
        } else if part.bytes().all(|b| b.is_ascii_lowercase()) {
            named = named.or_else(|| Suite::parse(part).ok());
        }
    }
    let suites: Vec<((u32, u32), Suite)> = DEBIAN_PYTHONS
        .iter()
        .filter_map(|(v, s)| Some((minor_version(v)?, Suite::parse(s).ok()?)))
        .collect();
    let wanted = asked.as_deref().and_then(minor_version);
    let python_of = |suite: &Suite| suites.iter().find(|(_, s)| s == suite).map(|(v, _)| *v);
    // Not older than asked, in the same major version.
    let enough = |v: (u32, u32)| wanted.is_none_or(|w| v.0 == w.0 && v >= w);
    let exact = suites.iter().find(|(v, _)| Some(*v) == wanted);
    let matches = exact.is_some();
    let suite = exact
        .map(|(_, s)| s.clone())
        .or_else(|| named.clone().filter(|n| python_of(n).is_some_and(enough)))
        .or_else(|| {
            let newer = suites.iter().find(|(v, _)| wanted.is_some() && enough(*v));
            newer.map(|(_, s)| s.clone())
        })
        .or_else(|| {
            let same_major = suites
                .iter()
                .rev()
                .find(|(v, _)| wanted.is_some_and(|w| v.0 == w.0));
            same_major.map(|(_, s)| s.clone())
        })
        .or_else(|| named.clone())
        .or_else(|| Suite::parse(PYTHON_IMAGES_SUITE).ok())?;
    Some(PythonBase {
        suite,
        asked,
        matches,
        named,
    })
}

impl PythonBase {
    /// The step that makes the suite's minimal system the image: its `python3`, pip, venv,
    /// `python` and pytest, from the suite's archive through the build network.
    fn step(line: usize) -> super::dockerfile::Instruction {
        let script = format!(
            "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y \
             --no-install-recommends {PYTHON_PACKAGES} && rm -rf /var/lib/apt/lists/*"
        );
        super::dockerfile::Instruction {
            line,
            text: format!("RUN {script}"),
            step: Step::Run { script },
        }
    }

    /// How the Python compares with the one asked for, in words.
    fn version_note(&self) -> String {
        let version = match (&self.asked, self.matches) {
            (Some(v), true) => format!("Python {v} as asked"),
            (Some(v), false) => format!(
                "Python {v} is in no Debian suite made here ({}): {}'s python3 instead",
                DEBIAN_PYTHONS
                    .iter()
                    .map(|(v, s)| format!("{v} {s}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                self.suite
            ),
            (None, _) => format!("{}'s python3", self.suite),
        };
        match &self.named {
            Some(n) if *n != self.suite => {
                format!("{version}; the tag's {n} has another Python")
            }
            _ => version,
        }
    }
}

/// How `FROM debian:SUITE` is taken without a local image of that name: the suite
/// debootstrapped (`Ok`), or this host's system, with the reason (`Err`).
fn debian_base(rt: &Runtime, suite: &Suite, network: &BuildNetwork) -> Result<(), String> {
    let host = debootstrap::host_suite();
    if host.as_ref() == Some(suite) {
        return Err(format!(
            "this host's own Debian suite; `--base debootstrap:{suite}` for that image's minimal system"
        ));
    }
    let instead = host.map_or_else(
        || "this host's system instead".to_string(),
        |h| format!("this host's Debian {h} instead"),
    );
    match debootstrap::cached(rt.state_dir(), suite) {
        // Not made, or never makeable here (`unavailable` below says why).
        Ok(None) | Err(debootstrap::DebootstrapError::Arch(_)) => {}
        // Made before (or unreadable: resolving it then names the error).
        _ => return Ok(()),
    }
    if *network == BuildNetwork::Offline {
        return Err(format!(
            "no local image, and an offline build makes no Debian {suite}: {instead}"
        ));
    }
    if let Some(e) = debootstrap::unavailable() {
        return Err(format!(
            "no local image, and Debian {suite} cannot be made here ({e}): {instead}"
        ));
    }
    Ok(())
}

/// Where `FROM image` comes from: `base` when given, else the local Docker daemon's image of
/// that name, else for `debian:SUITE` that suite made with debootstrap, and for `python:TAG`
/// the suite of [`python_base`], whose Python [`build_image`]'s first step installs (made
/// once; this host's system when it is the host's own suite, the build is offline or
/// debootstrap is missing), else `host` for another Debian-family name; else an error naming
/// the line.
pub fn resolve_from(
    rt: &Runtime,
    task: &Task,
    df: &Dockerfile,
    opts: &BuildOptions,
) -> Result<(RootfsSpec, String), HarborError> {
    if let Some(b) = &opts.base {
        return Ok((b.clone(), format!("FROM {} -> {b} (--base)", df.from)));
    }
    let failed = |e: &dyn std::fmt::Display| HarborError::Build {
        file: task.dockerfile.clone(),
        line: df.from_line,
        reason: format!("FROM {}: {e}", df.from),
    };
    let spec = RootfsSpec::Docker(df.from.clone());
    match rt.resolve(&spec) {
        Ok(_) => Ok((spec, format!("FROM {} -> docker:{}", df.from, df.from))),
        Err(e) if is_debian_family(&df.from) => {
            tracing::debug!(image = %df.from, error = %e, "no local image");
            let python = python_base(&df.from);
            let suite = debian_suite(&df.from).or_else(|| python.as_ref().map(|p| p.suite.clone()));
            let Some(suite) = suite else {
                return Ok((
                    RootfsSpec::Host,
                    format!(
                        "FROM {} -> host (no local image of that name; a Debian-family base)",
                        df.from
                    ),
                ));
            };
            match debian_base(rt, &suite, &opts.network) {
                // The suite's python3 comes from its archive, which an offline build lacks
                // (and its layers are keyed by the network: an online build's are not taken).
                Ok(()) if python.is_some() && opts.network == BuildNetwork::Offline => Ok((
                    RootfsSpec::Host,
                    format!(
                        "FROM {} -> host (no local image, and an offline build cannot install Debian {suite}'s python3: this host's system instead)",
                        df.from
                    ),
                )),
                Ok(()) => {
                    let spec = RootfsSpec::Debootstrap(suite.clone());
                    rt.resolve(&spec).map_err(|e| failed(&e))?;
                    Ok((
                        spec,
                        format!(
                            "FROM {} -> debootstrap:{suite} (no local image; Debian {suite}'s minimal system, made once)",
                            df.from
                        ),
                    ))
                }
                Err(why) => Ok((
                    RootfsSpec::Host,
                    format!("FROM {} -> host ({why})", df.from),
                )),
            }
        }
        Err(e) => Err(failed(&e)),
    }
}

/// A glob (`*`, `?`) of one path matched against a relative path.
fn glob_match(pat: &str, s: &str) -> bool {
    fn m(p: &[u8], s: &[u8]) -> bool {
        match (p.first(), s.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], s) || (!s.is_empty() && s[0] != b'/' && m(p, &s[1..])),
            (Some(b'?'), Some(c)) if *c != b'/' => m(&p[1..], &s[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &s[1..]),
            _ => false,
        }
    }
    m(pat.as_bytes(), s.as_bytes())
}

/// The files a `COPY` writes: (path in the image, data, mode), and the directories it makes.
type Writes = (Vec<(String, Vec<u8>, u32)>, Vec<String>);

fn copy_writes(
    task: &Task,
    line: usize,
    sources: &[Source],
    dest: &str,
    workdir: &str,
    chmod: Option<u32>,
) -> Result<Writes, HarborError> {
    let bad = |reason: String| HarborError::Build {
        file: task.dockerfile.clone(),
        line,
        reason,
    };
    let dest = if dest.starts_with('/') {
        dest.to_string()
    } else {
        format!("{}/{dest}", workdir.trim_end_matches('/'))
    };
    let into_dir = dest.ends_with('/') || sources.len() > 1;
    let dest = dest.trim_end_matches('/').to_string();
    let dest = if dest.is_empty() { "/".into() } else { dest };
    let join = |a: &str, b: &str| format!("{}/{}", a.trim_end_matches('/'), b);
    let ctx_files = super::task::files_under(&task.context)?;
    let mut files = Vec::new();
    let mut dirs: Vec<String> = Vec::new();
    for s in sources {
        match s {
            Source::Heredoc { name, body } => {
                let p = if into_dir || dest == "/" {
                    join(&dest, name)
                } else {
                    dest.clone()
                };
                files.push((p, body.clone().into_bytes(), chmod.unwrap_or(0o644)));
            }
            Source::Path(p) => {
                let p = p.trim_start_matches("./").trim_end_matches('/');
                if p.split('/').any(|c| c == "..") {
                    return Err(bad(format!("COPY source `{p}` leaves the build context")));
                }
                let is_glob = p.contains(['*', '?']);
                let mut matched = false;
                for (rel, host) in &ctx_files {
                    let (in_image, hit) = if p.is_empty() || p == "." {
                        (join(&dest, rel), true)
                    } else if is_glob {
                        // A glob matches files, or the folders whose contents come along.
                        let first = rel
                            .match_indices('/')
                            .map(|(i, _)| &rel[..i])
                            .chain([rel.as_str()])
                            .find(|prefix| glob_match(p, prefix));
                        match first {
                            Some(prefix) => {
                                let base = Path::new(prefix)
                                    .file_name()
                                    .map(|n| n.to_string_lossy().into_owned())
                                    .unwrap_or_default();
                                let tail = &rel[prefix.len()..];
                                if tail.is_empty() {
                                    (join(&dest, &base), true)
                                } else {
                                    (join(&dest, tail.trim_start_matches('/')), true)
                                }
                            }
                            None => (String::new(), false),
                        }
                    } else if rel == p {
                        let name = Path::new(rel)
                            .file_name()
                            .map(|n| n.to_string_lossy().into_owned())
                            .unwrap_or_default();
                        if into_dir {
                            (join(&dest, &name), true)
                        } else {
                            (dest.clone(), true)
                        }
                    } else if let Some(tail) = rel.strip_prefix(&format!("{p}/")) {
                        (join(&dest, tail), true)
                    } else {
                        (String::new(), false)
                    };
                    if !hit {
                        continue;
                    }
                    matched = true;
                    let data = std::fs::read(host).map_err(|source| HarborError::Io {
                        path: host.clone(),
                        source,
                    })?;
                    let mode = match chmod {
                        Some(m) => m,
                        None => std::fs::metadata(host)
                            .map(|m| m.permissions().mode() & 0o7777)
                            .unwrap_or(0o644),
                    };
                    files.push((in_image, data, mode));
                }
                if !matched {
                    return Err(bad(format!(
                        "COPY source `{p}` matches nothing in the build context {}",
                        task.context.display()
                    )));
                }
            }
        }
    }
    if into_dir || files.is_empty() {
        dirs.push(dest.clone());
    }
    for (p, _, _) in &files {
        if let Some((parent, _)) = p.rsplit_once('/') {
            if !parent.is_empty() && !dirs.iter().any(|d| d == parent) {
                dirs.push(parent.to_string());
            }
        }
    }
    Ok((files, dirs))
}

/// `USER name[:group]` as ids, read from the image's `/etc/passwd` and `/etc/group`.
fn resolve_user(
    lowers: &[PathBuf],
    spec: &str,
    task: &Task,
    line: usize,
) -> Result<(u32, u32), HarborError> {
    let view = crate::instance::BaseView::from_dirs(lowers.to_vec());
    let lookup = |file: &str, name: &str| -> Option<(u32, u32)> {
        let text = String::from_utf8(view.read(file)?).ok()?;
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.first() == Some(&name) && f.len() > 3)
                .then(|| Some((f[2].parse().ok()?, f[3].parse().unwrap_or(0))))
                .flatten()
        })
    };
    let (u, g) = spec
        .split_once(':')
        .map_or((spec, None), |(u, g)| (u, Some(g)));
    let (uid, mut gid) = match u.parse::<u32>() {
        Ok(uid) => (uid, uid),
        Err(_) => lookup("/etc/passwd", u).ok_or_else(|| HarborError::Build {
            file: task.dockerfile.clone(),
            line,
            reason: format!("USER {u}: no such user in the image's /etc/passwd"),
        })?,
    };
    if let Some(g) = g {
        gid =
            match g.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => lookup("/etc/group", g).map(|(gid, _)| gid).ok_or_else(|| {
                    HarborError::Build {
                        file: task.dockerfile.clone(),
                        line,
                        reason: format!("USER {spec}: no such group in the image's /etc/group"),
                    }
                })?,
            };
    }
    Ok((uid, gid))
}

/// What the host trusts for TLS: build steps on a debootstrapped suite see it in place of the
/// suite's bundle, as steps on the `host` base do (a registry behind a TLS-intercepting
/// egress, whose CA the host holds, is then reachable from both).
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The host's CA bundle as a layer of the store holding only that file at its usual path, for
/// build steps on a debootstrapped suite: topmost in their sandbox (so a step that changes the
/// suite's bundle does not drop the host's for the next), not in the image.
struct HostTrust {
    layer: PathBuf,
    bundle: Vec<u8>,
}

impl HostTrust {
    /// The layer for `rootfs`'s build steps (`None` on other bases, or where the host has no
    /// bundle), made once per bundle content in the store.
    fn of(store: &LayerStore, rootfs: &RootfsSpec) -> Result<Option<Self>, HarborError> {
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if !matches!(rootfs, RootfsSpec::Debootstrap(_)) {
            return Ok(None);
        }
        let Ok(bundle) = std::fs::read(HOST_CA_BUNDLE) else {
            return Ok(None);
        };
        let digest = hex::encode(&Sha256::digest(&bundle)[..16]);
        let layer = store.dir.join(format!(".host-trust-{digest}"));
        if layer.is_dir() {
            return Ok(Some(Self { layer, bundle }));
        }
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = store.dir.join(format!(
            ".tmp-host-trust-{digest}-{n}-{}",
            std::process::id()
        ));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| HarborError::Io { path, source }
        };
        let _ = std::fs::remove_dir_all(&tmp);
        let made = (|| {
            // Modes set, not left to the umask: overlayfs shows a merged directory with its
            // topmost lower's mode, and a step's copy-up of `/etc` keeps it in the image.
            let mut dir = tmp.clone();
            for part in ["", "etc", "ssl", "certs"] {
                dir.push(part);
                std::fs::create_dir_all(&dir).map_err(io(&dir))?;
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
                    .map_err(io(&dir))?;
            }
            let file = tmp.join(HOST_CA_BUNDLE.trim_start_matches('/'));
            std::fs::write(&file, &bundle).map_err(io(&file))?;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))
                .map_err(io(&file))
        })();
        if made.is_err() || std::fs::rename(&tmp, &layer).is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
            made?;
            // Another build published it first: theirs holds the same bytes.
            if !layer.is_dir() {
                return Err(io(&layer)(std::io::Error::other(
                    "neither published nor published by another build",
                )));
            }
        }
        Ok(Some(Self { layer, bundle }))
    }

    /// Take the host's bundle out of a step's diff where the step only copied it up (a
    /// `chmod`, a `touch`): the image keeps the suite's own. A bundle the step changed keeps
    /// its content, the host's certificates with the change (public certificates).
    fn forget_in(&self, diff: &Path) {
        let rel = HOST_CA_BUNDLE.trim_start_matches('/');
        let file = diff.join(rel);
        let mtime = |p: &Path| {
            std::fs::symlink_metadata(p)
                .ok()
                .filter(std::fs::Metadata::is_file)
                .map(|m| (m.mtime(), m.mtime_nsec()))
        };
        // A copy-up keeps the file's modification time (so do `chmod` and `chown`); a bundle
        // the step wrote anew, even with the same bytes, has its own, and stays.
        let copied = mtime(&file).is_some_and(|t| Some(t) == mtime(&self.layer.join(rel)))
            && std::fs::read(&file).is_ok_and(|b| b == self.bundle);
        if copied {
            let _ = std::fs::remove_file(&file);
        }
    }
}

/// The configuration of a build sandbox: the base, the layers so far, generous limits.
fn build_config(
    rootfs: &RootfsSpec,
    layers: &[PathBuf],
    env: &[(String, String)],
) -> SandboxConfig {
    let mut cfg = SandboxConfig {
        rootfs: rootfs.clone(),
        layers: layers.to_vec(),
        disk_bytes: 4 << 30,
        ..SandboxConfig::default()
    };
    cfg.limits.memory_bytes = 2 << 30;
    cfg.limits.pids = 1024;
    cfg.limits.cpus = 0.0;
    cfg.env = merge_env(&cfg.env, env);
    cfg
}

/// `base` (`KEY=VALUE`) with `over` set on top.
pub fn merge_env(base: &[String], over: &[(String, String)]) -> Vec<String> {
    let mut out: Vec<String> = base.to_vec();
    for (k, v) in over {
        let prefix = format!("{k}=");
        out.retain(|e| !e.starts_with(&prefix));
        out.push(format!("{k}={v}"));
    }
    out
}

/// The cache key of the base: the rootfs's digest, the build network and what a substitution
/// adds to the steps' environment (these change what the steps build; v2: the network entered
/// the key).
fn base_key(
    rt: &Runtime,
    rootfs: &RootfsSpec,
    from: &str,
    network: &BuildNetwork,
) -> Result<(sandbox::layers::Rootfs, String), HarborError> {
    let resolved = rt
        .resolve(rootfs)
        .map_err(sbx_err(format!("rootfs {rootfs}")))?;
    let substituted: String = substitution_env(rootfs, from)
        .iter()
        .map(|(k, v)| format!("\n{k}={v}"))
        .collect();
    let key = hex::encode(Sha256::digest(
        format!(
            "envfactory-harbor-v2\n{}\nnetwork {}{substituted}",
            resolved.digest,
            network.cache_key()
        )
        .as_bytes(),
    ));
    Ok((resolved, key))
}

/// The cache key of a step's layer: the key of everything before it and the instruction (a
/// `COPY` adds what it copies before the key is taken).
fn step_hasher(before: &str, text: &str) -> Sha256 {
    let mut h = Sha256::new();
    h.update(before.as_bytes());
    h.update(b"\n");
    h.update(text.as_bytes());
    h
}

/// Build (or find in the store) a task's image.
pub fn build_image(
    rt: &Runtime,
    store: &LayerStore,
    task: &Task,
    df: &Dockerfile,
    opts: &BuildOptions,
) -> Result<Image, HarborError> {
    let (rootfs, mut base_note) = resolve_from(rt, task, df, opts)?;
    // A `python` image made of a Debian suite: that suite's Python is its first step (a
    // layer like any other, shared by every `python` task on the same suite and network).
    let python_step = match (&rootfs, python_base(&df.from)) {
        (RootfsSpec::Debootstrap(suite), Some(p)) => {
            // Only `--base` gets here offline (`resolve_from` takes the host then).
            if opts.network == BuildNetwork::Offline {
                return Err(HarborError::Build {
                    file: task.dockerfile.clone(),
                    line: df.from_line,
                    reason: format!(
                        "FROM {}: an offline build cannot install Debian {suite}'s python3 on {rootfs}; build online, or on --base host",
                        df.from
                    ),
                });
            }
            let version = if p.suite == *suite {
                p.version_note()
            } else {
                format!("{suite}'s python3")
            };
            base_note += &format!("; with its python3, pip, venv and pytest ({version})");
            Some(PythonBase::step(df.from_line))
        }
        _ => None,
    };
    let (resolved, mut key) = base_key(rt, &rootfs, &df.from, &opts.network)?;
    // Made at the first step that is not cached.
    let mut trust: Option<Option<HostTrust>> = None;
    let step_env = substitution_env(&rootfs, &df.from);
    if !step_env.is_empty() {
        base_note += "; pip installs into /usr/local as in that image (PIP_BREAK_SYSTEM_PACKAGES=1 in build steps)";
    }
    let mut img = Image {
        rootfs: rootfs.clone(),
        layers: Vec::new(),
        base_lowers: resolved.lowers.iter().map(PathBuf::from).collect(),
        env: Vec::new(),
        user: None,
        workdir: "/".into(),
        built: 0,
        cached: 0,
        base_note,
        runtime: Default::default(),
        applied: Vec::new(),
    };
    let mut user_spec: Option<(String, usize)> = None;
    for ins in python_step.iter().chain(&df.steps) {
        let mut h = step_hasher(&key, &ins.text);
        let mut copy = None;
        let script: Option<String> = match &ins.step {
            Step::Run { script } => Some(script.clone()),
            Step::Copy {
                sources,
                dest,
                chown,
                chmod,
            } => {
                let w = copy_writes(task, ins.line, sources, dest, &img.workdir, *chmod)?;
                for (p, data, mode) in &w.0 {
                    h.update(format!("\n{p} {mode:o} {}\n", data.len()).as_bytes());
                    h.update(data);
                }
                copy = Some((w, chown.clone()));
                None
            }
            Step::Workdir(d) => {
                img.workdir = if d.starts_with('/') {
                    d.clone()
                } else {
                    format!("{}/{d}", img.workdir.trim_end_matches('/'))
                };
                Some(format!(
                    "mkdir -p {}",
                    crate::instance::sh_quote(&img.workdir)
                ))
            }
            Step::Env(kvs) => {
                for (k, v) in kvs {
                    img.env.retain(|(k2, _)| k2 != k);
                    img.env.push((k.clone(), v.clone()));
                }
                None
            }
            Step::Arg(name, default) => {
                if !img.env.iter().any(|(k, _)| k == name) {
                    img.env
                        .push((name.clone(), default.clone().unwrap_or_default()));
                }
                None
            }
            Step::User(u) => {
                user_spec = Some((u.clone(), ins.line));
                None
            }
            Step::Ignored(_) => None,
        };
        key = hex::encode(h.finalize());
        if script.is_none() && copy.is_none() {
            continue;
        }
        let layer = store.dir.join(&key);
        if layer.is_dir() {
            img.cached += 1;
            img.layers.insert(0, layer);
            continue;
        }
        if trust.is_none() {
            trust = Some(HostTrust::of(store, &rootfs)?);
        }
        let trusted = trust.as_ref().and_then(Option::as_ref);
        let below: Vec<PathBuf> = trusted
            .map(|t| t.layer.clone())
            .into_iter()
            .chain(img.layers.iter().cloned())
            .collect();
        let cfg = build_config(&rootfs, &below, &img.env);
        let mut sbx = rt
            .create(&cfg)
            .map_err(sbx_err(format!("build sandbox for line {}", ins.line)))?;
        // The Python step is not in the file: its failure names the `FROM` it serves.
        let serves = if python_step.as_ref().is_some_and(|p| std::ptr::eq(p, ins)) {
            format!(
                "FROM {}: installing {PYTHON_PACKAGES} from the Debian archive: ",
                df.from
            )
        } else {
            String::new()
        };
        let fail = |reason: String| HarborError::Build {
            file: task.dockerfile.clone(),
            line: ins.line,
            reason: format!("{serves}{reason}"),
        };
        let user = match &user_spec {
            Some((u, l)) => Some(resolve_user(
                &resolved_lowers(rt, &rootfs, &img)?,
                u,
                task,
                *l,
            )?),
            None => None,
        };
        // A `RUN` reaches the registries through a proxy in its sandbox's network namespace.
        let proxy = match (&opts.network, &ins.step) {
            (BuildNetwork::Registries(allowed), Step::Run { .. }) => Some(
                RegistryProxy::start(sbx.init_pid(), allowed).map_err(|source| {
                    HarborError::BuildNetwork {
                        file: task.dockerfile.clone(),
                        line: ins.line,
                        source,
                    }
                })?,
            ),
            _ => None,
        };
        // The step's environment: the image's, and the substitution's and the proxy's.
        let mut over = step_env.clone();
        over.extend(proxy.as_ref().map(RegistryProxy::env).unwrap_or_default());
        let env = (!over.is_empty()).then(|| merge_env(&cfg.env, &over));
        let run = |sbx: &mut sandbox::Sandbox, cmd: String, user| -> Result<(), HarborError> {
            let mut req = ExecRequest::shell(cmd);
            req.cwd = "/".into();
            req.timeout_ms = 3_600_000;
            req.user = user;
            req.env.clone_from(&env);
            let r = sbx
                .exec(&req)
                .map_err(sbx_err(format!("line {}", ins.line)))?;
            if r.success() {
                return Ok(());
            }
            let err = String::from_utf8_lossy(&r.stderr);
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            let refused = proxy
                .as_ref()
                .map(RegistryProxy::refused)
                .unwrap_or_default();
            let network = if refused.is_empty() {
                String::new()
            } else {
                format!(" (the build network refused {})", refused.join(", "))
            };
            Err(fail(format!(
                "the step failed (exit {}): {}{network}",
                r.exit_code(),
                crate::text::cut(&tail.join(" | "))
            )))
        };
        if let Some(script) = script {
            let wd = crate::instance::sh_quote(&img.workdir);
            let cmd = format!(
                "mkdir -p {wd} 2>/dev/null; cd {wd} && exec /bin/sh -c {}",
                crate::instance::sh_quote(&script)
            );
            let as_user = if matches!(ins.step, Step::Workdir(_)) {
                None
            } else {
                user
            };
            run(&mut sbx, cmd, as_user)?;
        }
        if let Some(((files, dirs), chown)) = copy {
            let q: Vec<String> = dirs.iter().map(|d| crate::instance::sh_quote(d)).collect();
            if !q.is_empty() {
                run(&mut sbx, format!("mkdir -p {}", q.join(" ")), None)?;
            }
            for (p, data, mode) in &files {
                sbx.write_file(p, data, *mode)
                    .map_err(sbx_err(format!("line {}: writing {p}", ins.line)))?;
            }
            if let Some(owner) = chown {
                let q: Vec<String> = files
                    .iter()
                    .map(|(p, _, _)| crate::instance::sh_quote(p))
                    .collect();
                run(
                    &mut sbx,
                    format!(
                        "chown {} {}",
                        crate::instance::sh_quote(&owner),
                        q.join(" ")
                    ),
                    None,
                )?;
            }
        }
        sbx.kill_all().map_err(sbx_err("stopping the build step"))?;
        drop(proxy);
        let tmp = store.dir.join(format!(".tmp-{key}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        if let Err(e) = sbx.export_diff(&tmp, cfg.disk_bytes) {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(sbx_err(format!("line {}: saving the layer", ins.line))(e));
        }
        if let Some(t) = trusted {
            t.forget_in(&tmp);
        }
        drop(sbx);
        if let Err(e) = std::fs::rename(&tmp, &layer) {
            // Another process published the same layer first: theirs is as good.
            let _ = std::fs::remove_dir_all(&tmp);
            if !layer.is_dir() {
                return Err(HarborError::Io {
                    path: layer,
                    source: e,
                });
            }
        }
        tracing::info!(task = %task.name, line = ins.line, key = %key, "built a layer");
        img.built += 1;
        img.layers.insert(0, layer);
    }
    if let Some((u, l)) = &user_spec {
        img.user = Some(resolve_user(
            &resolved_lowers(rt, &rootfs, &img)?,
            u,
            task,
            *l,
        )?);
    }
    Ok(img)
}

/// The lower directories of an image so far (its layers over its resolved rootfs).
fn resolved_lowers(
    rt: &Runtime,
    rootfs: &RootfsSpec,
    img: &Image,
) -> Result<Vec<PathBuf>, HarborError> {
    let r = rt
        .resolve(rootfs)
        .map_err(sbx_err(format!("rootfs {rootfs}")))?;
    let mut out = img.layers.clone();
    out.extend(r.lowers.iter().map(PathBuf::from));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_family_names() {
        assert!(glob_match("*.py", "a.py"));
        assert!(!glob_match("*.py", "d/a.py"));
        assert!(glob_match("d/*.txt", "d/x.txt"));
        assert!(glob_match("dat?", "data"));
        assert!(is_debian_family("debian:bookworm-slim"));
        assert!(is_debian_family("docker.io/library/ubuntu:24.04"));
        assert!(!is_debian_family("alpine:3.19"));
        let suite = |image: &str| debian_suite(image).map(|s| s.name().to_string());
        assert_eq!(suite("debian:trixie-slim").as_deref(), Some("trixie"));
        assert_eq!(
            suite("docker.io/library/debian:13").as_deref(),
            Some("trixie")
        );
        assert_eq!(suite("debian").as_deref(), Some("stable"));
        assert_eq!(
            suite("debian:bookworm@sha256:abc").as_deref(),
            Some("bookworm")
        );
        assert_eq!(suite("debian:bookworm-backports"), None);
        assert_eq!(suite("ubuntu:24.04"), None);
        assert_eq!(suite("python:3.12-trixie"), None);
    }

    #[test]
    fn only_a_copied_up_host_bundle_leaves_a_steps_layer() {
        let t = tempfile::tempdir().unwrap();
        let rel = HOST_CA_BUNDLE.trim_start_matches('/');
        let trust = HostTrust {
            layer: t.path().join("trust"),
            bundle: b"host CAs\n".to_vec(),
        };
        let put = |root: &Path, bytes: &[u8]| {
            let f = root.join(rel);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(&f, bytes).unwrap();
            f
        };
        let theirs = put(&trust.layer, &trust.bundle);
        let when = std::fs::metadata(&theirs).unwrap().modified().unwrap();
        let earlier = when - std::time::Duration::from_secs(60);
        // Copied up (a chmod): same bytes, same time: taken out.
        let copied = put(&t.path().join("a"), &trust.bundle);
        std::fs::File::options()
            .write(true)
            .open(&copied)
            .unwrap()
            .set_modified(when)
            .unwrap();
        trust.forget_in(&t.path().join("a"));
        assert!(!copied.exists());
        // Written anew with the same bytes, or edited: kept.
        for (dir, bytes) in [
            ("b", trust.bundle.clone()),
            ("c", b"host CAs\nmine\n".to_vec()),
        ] {
            let f = put(&t.path().join(dir), &bytes);
            if dir == "c" {
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_modified(when)
                    .unwrap();
            } else {
                std::fs::File::options()
                    .write(true)
                    .open(&f)
                    .unwrap()
                    .set_modified(earlier)
                    .unwrap();
            }
            trust.forget_in(&t.path().join(dir));
            assert!(f.exists(), "{dir}");
        }
    }

    #[test]
    fn python_tags_take_the_suite_with_their_python() {
        let base = |image: &str| {
            python_base(image).map(|p| (p.suite.name().to_string(), p.asked, p.matches))
        };
        let is = |suite: &str, asked: Option<&str>, matches: bool| {
            Some((suite.to_string(), asked.map(str::to_string), matches))
        };
        assert_eq!(base("python:3.13-slim"), is("trixie", Some("3.13"), true));
        assert_eq!(base("python:3.13.1"), is("trixie", Some("3.13"), true));
        assert_eq!(
            base("docker.io/library/python:3.11-slim-bookworm@sha256:ab"),
            is("bookworm", Some("3.11"), true)
        );
        assert_eq!(
            base("python:3.9-bullseye"),
            is("bullseye", Some("3.9"), true)
        );
        // The version decides over the suite the tag names: its tests run with that Python.
        assert_eq!(
            base("python:3.11-slim-trixie"),
            is("bookworm", Some("3.11"), true)
        );
        // A version no suite has: the suite the tag names if its Python is not older, else
        // the oldest with a newer Python of that major version, else the images' default.
        assert_eq!(
            base("python:3.12-slim-bookworm"),
            is("trixie", Some("3.12"), false)
        );
        assert_eq!(
            base("python:3.10-slim-bookworm"),
            is("bookworm", Some("3.10"), false)
        );
        assert_eq!(
            base("python:3.14-slim-bookworm"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(base("python:2.7-slim"), is("trixie", Some("2.7"), false));
        assert_eq!(base("python:2.7-buster"), is("trixie", Some("2.7"), false));
        assert_eq!(
            base("python:2.7-bullseye"),
            is("bullseye", Some("2.7"), false)
        );
        assert_eq!(base("python:3.12-slim"), is("trixie", Some("3.12"), false));
        assert_eq!(base("python:3.10"), is("bookworm", Some("3.10"), false));
        assert_eq!(
            base("python:3.8-buster"),
            is("bullseye", Some("3.8"), false)
        );
        assert_eq!(
            base("python:3.14.0rc1-slim"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(
            base("python:3.14-rc-slim"),
            is("trixie", Some("3.14"), false)
        );
        assert_eq!(base("python:3-slim"), is("trixie", None, false));
        assert_eq!(base("python"), is("trixie", None, false));
        assert_eq!(base("python:slim-bookworm"), is("bookworm", None, false));
        // A suite not made here names nothing: the version decides.
        assert_eq!(
            base("python:3.9-slim-buster"),
            is("bullseye", Some("3.9"), true)
        );
        assert_eq!(
            base("localhost:5000/python:3.13"),
            is("trixie", Some("3.13"), true)
        );
        // Not Debian, not python.
        assert_eq!(base("python:3.12-alpine3.20"), None);
        assert_eq!(base("python:3.12-windowsservercore-ltsc2022"), None);
        assert_eq!(base("python:3.12-nanoserver"), None);
        assert_eq!(base("debian:trixie"), None);
        assert!(python_base("python:3.13-slim-bookworm")
            .unwrap()
            .version_note()
            .ends_with("Python 3.13 as asked; the tag's bookworm has another Python"));
        assert!(python_base("python:3.12-slim")
            .unwrap()
            .version_note()
            .contains("Python 3.12 is in no Debian suite made here"));
    }
}
