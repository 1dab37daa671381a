//! A task's Dockerfile built into read-only layers: each `RUN`, `COPY`/`ADD` and `WORKDIR`
//! runs in a build sandbox over the base and the layers before it (a `RUN` reaches the
//! package registries through the build network, `registries.rs`, and nothing else), and
//! its diff becomes a layer of the store, named by its cache key: the base's digest, the
//! build network, the instruction and everything before it (and the content of what `COPY`
//! reads). A layer
//! is published by rename only after its step succeeded: no half-built layer is ever used,
//! and a failed step leaves every earlier layer in place.

use super::dockerfile::{repository, tag, Dockerfile, Source, Step};
use super::host_trust::HostTrust;
use super::python_base::{python_base, PythonBase, PYTHON_PACKAGES};
use super::registries::{BuildNetwork, RegistryProxy};
use super::{sbx_err, HarborError, Task};
use sandbox::debootstrap::{self, Suite};
use sandbox::{ExecRequest, RootfsSpec, Runtime, SandboxConfig};
use sha2::{Digest, Sha256};
use std::os::unix::fs::PermissionsExt;
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

/// The Debian suite a `debian` image's name stands for (`debian:trixie-slim`, `debian:13`,
/// `debian` alone is `latest`, that is `stable`); `None` for other images and other tags.
fn debian_suite(image: &str) -> Option<Suite> {
    if repository(image) != "debian" {
        return None;
    }
    Suite::of_debian_tag(tag(image))
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
/// the suite of `python_base::python_base`, whose Python [`build_image`]'s first step installs (made
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
    let step_env = substitution_env(&rootfs, &df.from);
    if !step_env.is_empty() {
        base_note += "; pip installs into /usr/local as in that image (PIP_BREAK_SYSTEM_PACKAGES=1 in build steps)";
    }
    let resolved = rt
        .resolve(&rootfs)
        .map_err(sbx_err(format!("rootfs {rootfs}")))?;
    // What a substitution adds to the steps' environment, and the network they reach,
    // change what they build (v2: the network entered the key).
    let substituted: String = step_env.iter().map(|(k, v)| format!("\n{k}={v}")).collect();
    let mut key = hex::encode(Sha256::digest(
        format!(
            "envfactory-harbor-v2\n{}\nnetwork {}{substituted}",
            resolved.digest,
            opts.network.cache_key()
        )
        .as_bytes(),
    ));
    // Made at the first step that is not cached.
    let mut trust: Option<Option<HostTrust>> = None;
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
        let mut h = Sha256::new();
        h.update(key.as_bytes());
        h.update(b"\n");
        h.update(ins.text.as_bytes());
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
            trust = Some(HostTrust::of(store.dir(), &rootfs)?);
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
}
