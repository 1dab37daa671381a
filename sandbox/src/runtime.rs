//! The [`Runtime`]: one per process (run id, layer and policy caches, cgroup layout). It
//! creates [`Sandbox`]es, each around a resident init started from an [`InitProgram`].

use crate::cgroup::{self, Cgroup};
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::layers::{self, LayerError, Rootfs, RootfsSpec};
use crate::lock;
use crate::sandbox::Sandbox;
use crate::state;
use crate::sys::RealSys;
use std::collections::HashMap;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// What a create logs (at debug level) when the host changed while the sandbox was set up
/// and it is made again from a fresh walk (a one-shot's only sandbox then has two inits).
pub const MADE_AGAIN_HOST_CHANGED: &str = "the host changed since its walk was remembered, or its mask's entry since it was built: made again";

/// The program that becomes PID 1 of each sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProgram {
    pub path: PathBuf,
    pub args: Vec<String>,
}

impl InitProgram {
    /// `$ENVFACTORY_INIT`, else `envfactory-init` beside the running executable (or one
    /// directory up, as for test binaries in `target/*/deps`).
    pub fn locate() -> Result<Self, SandboxError> {
        if let Some(p) = std::env::var_os("ENVFACTORY_INIT") {
            return Self::at(PathBuf::from(p), vec![]);
        }
        let exe = std::env::current_exe().map_err(|e| SandboxError::InitProgram {
            path: "/proc/self/exe".into(),
            reason: e.to_string(),
        })?;
        let mut tried = Vec::new();
        for dir in exe.ancestors().skip(1).take(2) {
            let p = dir.join("envfactory-init");
            if p.is_file() {
                return Self::at(p, vec![]);
            }
            tried.push(p.display().to_string());
        }
        Err(SandboxError::InitProgram {
            path: "envfactory-init".into(),
            reason: format!(
                "not found (looked at {}); build it with `cargo build --bin envfactory-init` or set ENVFACTORY_INIT",
                tried.join(", ")
            ),
        })
    }

    /// A specific program with arguments.
    pub fn at(path: PathBuf, args: Vec<String>) -> Result<Self, SandboxError> {
        if !path.is_file() {
            return Err(SandboxError::InitProgram {
                path,
                reason: "no such file".into(),
            });
        }
        Ok(Self { path, args })
    }
}

struct Inner {
    state: PathBuf,
    run: String,
    run_dir: PathBuf,
    cgroups: cgroup::Layout,
    init: InitProgram,
    /// Sandboxes named so far (`s<N>`), spares included.
    counter: Arc<AtomicU64>,
    /// Sandboxes alive (admitted and not yet dropped).
    live: AtomicUsize,
    admission: Mutex<crate::Admission>,
    rootfs: Mutex<HashMap<RootfsSpec, Rootfs>>,
    host_mask: Mutex<Option<(PathBuf, String)>>,
    /// The store of built host masks (`mask_store.rs`) while it is usable; else the mask is
    /// built on a tmpfs of the run.
    mask_store: Mutex<Option<crate::mask_store::MaskStore>>,
    /// The store's entries this run's sandboxes use, held (never pruned) while the run lives:
    /// the one cached, and any other that a sandbox made on a pending mask runs on (one
    /// accepted after another sandbox's: the same entry, or one built again in between).
    mask_held: Mutex<Vec<crate::mask_store::HeldMask>>,
    /// Whether `<run>/hostmask` is already a shared mount point (see
    /// [`Runtime::share_host_mask_point`]).
    host_mask_point: Mutex<bool>,
    seccomp: Mutex<Option<crate::seccomp::CompiledSeccomp>>,
    /// Network namespaces made ahead of time (`netns.rs`).
    netns: Arc<crate::netns::NetnsReserve>,
    /// Inits started ahead of time (`init_reserve.rs`).
    inits: crate::init_reserve::InitReserve,
    /// Whether creates use them ([`Runtime::set_spare_inits`]).
    spares_on: std::sync::atomic::AtomicBool,
    /// Whether an init is forked from a single-threaded process ([`Runtime::set_forked_inits`]).
    forked_inits: std::sync::atomic::AtomicBool,
    /// Host mask store entries checked while an init set up (`PendingMask::entry_check`).
    deferred_entry_checks: std::sync::atomic::AtomicU64,
    /// Creates whose spare kept the root it had made ahead ([`Runtime::spare_roots_kept`]),
    /// and creates whose spare undid it ([`Runtime::spare_roots_undone`]).
    roots_made_ahead: std::sync::atomic::AtomicU64,
    roots_undone: std::sync::atomic::AtomicU64,
    /// Called once, right after the next init is started ([`Runtime::after_next_init_start`]).
    after_init_start: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

/// One process's handle on the sandbox machinery. Creating it reaps the leftovers of crashed
/// runs; dropping it removes everything the run created.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("run", &self.inner.run)
            .finish()
    }
}

impl Runtime {
    /// A runtime over `state` (see [`state::default_state_dir`]) using `init` as PID 1, with
    /// the default store of built host masks ([`crate::mask_store::default_dir`]).
    pub fn new(state: &Path, init: InitProgram) -> Result<Self, SandboxError> {
        Self::with_mask_store(state, init, Some(&crate::mask_store::default_dir()))
    }

    /// [`Runtime::new`] with the host mask store at `mask_store` (`None`, or a store that
    /// [`crate::mask_store::MaskStore::open`] refuses: each run builds its own mask).
    pub fn with_mask_store(
        state: &Path,
        init: InitProgram,
        mask_store: Option<&Path>,
    ) -> Result<Self, SandboxError> {
        let t0 = std::time::Instant::now();
        raise_nofile();
        let cgroups = cgroup::Layout::detect()?;
        let roots: Vec<PathBuf> = cgroups.roots().into_iter().map(|r| r.1).collect();
        let reaped = state::reap(state, &roots, None);
        if !reaped.runs.is_empty() {
            tracing::info!(
                runs = reaped.runs.len(),
                processes = reaped.processes,
                mounts = reaped.mounts,
                cgroups = reaped.cgroups,
                "reaped crashed runs"
            );
        }
        let run = state::new_run_id();
        let run_dir = state::create_run(state, &run)?;
        tracing::debug!(
            run = %run,
            dir = %run_dir.display(),
            us = t0.elapsed().as_micros() as u64,
            "runtime started"
        );
        let netns = Arc::new(crate::netns::NetnsReserve::new(
            crate::netns::DEFAULT_RESERVE,
        ));
        let counter = Arc::new(AtomicU64::new(0));
        let inits = crate::init_reserve::InitReserve::new(
            crate::init_reserve::DEFAULT_RESERVE,
            init.clone(),
            crate::init_reserve::Place {
                run: run.clone(),
                sbx: run_dir.join("sbx"),
                cgroups: cgroups.clone(),
                counter: counter.clone(),
            },
            netns.clone(),
        );
        Ok(Self {
            inner: Arc::new(Inner {
                state: state.to_path_buf(),
                run,
                run_dir,
                cgroups,
                init,
                counter,
                live: AtomicUsize::new(0),
                admission: Mutex::new(crate::Admission::default()),
                rootfs: Mutex::new(HashMap::new()),
                host_mask: Mutex::new(None),
                mask_store: Mutex::new(mask_store.and_then(crate::mask_store::MaskStore::open)),
                mask_held: Mutex::new(Vec::new()),
                host_mask_point: Mutex::new(false),
                seccomp: Mutex::new(None),
                netns,
                inits,
                spares_on: std::sync::atomic::AtomicBool::new(true),
                forked_inits: std::sync::atomic::AtomicBool::new(false),
                deferred_entry_checks: std::sync::atomic::AtomicU64::new(0),
                roots_made_ahead: std::sync::atomic::AtomicU64::new(0),
                roots_undone: std::sync::atomic::AtomicU64::new(0),
                after_init_start: Mutex::new(None),
            }),
        })
    }

    /// The default state directory and the located init program.
    pub fn from_env() -> Result<Self, SandboxError> {
        Self::new(&state::default_state_dir(), InitProgram::locate()?)
    }

    /// Set when new sandboxes are refused (by default: no cap, a reserve of a few percent of
    /// the machine's memory).
    pub fn set_admission(&self, a: crate::Admission) {
        *self
            .inner
            .admission
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = a;
    }

    /// When new sandboxes are refused.
    pub fn admission(&self) -> crate::Admission {
        *self
            .inner
            .admission
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Network namespaces made ahead of time and ready for the next sandboxes (the reserve
    /// starts at the second sandbox; see `netns.rs`).
    pub fn netns_ready(&self) -> usize {
        self.inner.netns.ready()
    }

    /// Inits started ahead and waiting for a sandbox's plan (the reserve starts at the second
    /// sandbox; see `init_reserve.rs`).
    pub fn spare_inits_ready(&self) -> usize {
        self.inner.inits.ready()
    }

    /// Whether the init reserve is full, not started, or pausing after a failure: no spare
    /// is being started now.
    pub fn spare_inits_idle(&self) -> bool {
        self.inner.inits.idle()
    }

    /// Let the init reserve start the spares taken so far again.
    pub(crate) fn refill_inits(&self) {
        self.inner.inits.refill();
    }

    /// With `on`, a create that clones its init while this process has a single thread (a
    /// one-shot command, before any other thread starts) forks it from this process instead
    /// of exec'ing the [`InitProgram`]: the sandbox crate's own init code, in a copy of this
    /// process with no descriptor, environment variable or signal handler of it (see
    /// `spawn_init::fork_init`). Off by default: a program that holds what must not be copied
    /// into any process, even a non-dumpable one, leaves it off. Processes with more threads
    /// exec the program; spares are forked by a fork server of their own
    /// ([`Runtime::set_forked_spares`]).
    pub fn set_forked_inits(&self, on: bool) {
        self.inner.forked_inits.store(on, Ordering::Relaxed);
    }

    /// Call `f` once, right after the next create has its init (started, or taken from the
    /// reserve), before the rest of its setup: a one-shot command starts its other threads
    /// there, once its init is forked, instead of after the whole create.
    pub fn after_next_init_start(&self, f: Box<dyn FnOnce() + Send>) {
        *lock(&self.inner.after_init_start) = Some(f);
    }

    /// Whether the init reserve's spares are forked by its fork server (the default: an
    /// `envfactory-init --forker` started once, which clones a copy of itself into each spare's
    /// namespaces, so that no spare pays for loading the program; see `init_forker.rs`) or
    /// each exec'd. Spares forked from one forker share its address space layout.
    pub fn set_forked_spares(&self, on: bool) {
        self.inner.inits.set_forked(on);
    }

    /// The pid of the init reserve's fork server as of the reserve's last spare start: `None`
    /// before the first and after a forker failed; it stays `Some` while the reserve keeps a
    /// forker it does not use (after `set_forked_spares(false)`, or after a clone it reported
    /// failed).
    pub fn init_forker_pid(&self) -> Option<i32> {
        self.inner.inits.forker_pid()
    }

    /// Whether creates take an init started ahead when one is ready (the default), or always
    /// clone their own (and start no reserve). Spares already waiting stay until the runtime
    /// goes.
    pub fn set_spare_inits(&self, on: bool) {
        self.inner.spares_on.store(on, Ordering::Relaxed);
    }

    /// Whether spares also mount the root of the plan the runtime expects (its first, then one
    /// that two creates in a row had) and start its zygote while they wait (the default),
    /// kept by a create whose plan has the same root and confinement (`init_reserve.rs`); off,
    /// they wait with only their side trees. Spares already waiting keep what they made.
    pub fn set_spare_roots(&self, on: bool) {
        self.inner.inits.set_roots_ahead(on);
    }

    /// Creates whose spare init kept the root and zygote it had made ahead.
    pub fn spare_roots_kept(&self) -> u64 {
        self.inner.roots_made_ahead.load(Ordering::Relaxed)
    }

    /// Creates whose spare init undid the root it had made ahead (another plan, or a layer
    /// path that named another directory by then).
    pub fn spare_roots_undone(&self) -> u64 {
        self.inner.roots_undone.load(Ordering::Relaxed)
    }

    /// How many creates checked their host mask store entry while their init set up (with
    /// a remembered walk's checks), not before it started.
    pub fn deferred_entry_checks(&self) -> u64 {
        self.inner.deferred_entry_checks.load(Ordering::Relaxed)
    }

    /// The host pids of the inits started ahead and waiting now, oldest first.
    pub fn spare_init_pids(&self) -> Vec<i32> {
        self.inner.inits.pids()
    }

    /// Inits the reserve failed to start (it tries again after a pause that doubles from
    /// 10 ms to 2 s, then every 2 s while it fails; see `init_reserve.rs`).
    pub fn spare_init_failures(&self) -> u64 {
        self.inner.inits.failures()
    }

    /// Sandboxes that got an init started ahead, and spares found stale or dead when taken
    /// (killed and reaped then; the sandbox cloned a fresh init).
    pub fn spare_inits_used(&self) -> (u64, u64) {
        self.inner.inits.counts()
    }

    /// Sandboxes of this runtime alive now.
    pub fn live_sandboxes(&self) -> usize {
        self.inner.live.load(Ordering::SeqCst)
    }

    /// Give back a live sandbox's place (its drop).
    pub(crate) fn release(&self) {
        crate::admission::release(&self.inner.live);
    }

    pub fn run_id(&self) -> &str {
        &self.inner.run
    }

    pub fn run_dir(&self) -> &Path {
        &self.inner.run_dir
    }

    pub fn state_dir(&self) -> &Path {
        &self.inner.state
    }

    /// The cgroup hierarchy roots in use.
    pub fn cgroup_roots(&self) -> Vec<PathBuf> {
        self.inner
            .cgroups
            .roots()
            .into_iter()
            .map(|r| r.1)
            .collect()
    }

    /// Resolve a rootfs source into layers (cached per runtime).
    pub fn resolve(&self, spec: &RootfsSpec) -> Result<Rootfs, SandboxError> {
        let mut cache = lock(&self.inner.rootfs);
        if let Some(r) = cache.get(spec) {
            return Ok(r.clone());
        }
        self.resolve_uncached(spec, &mut cache, None, false)
            .map(|(r, _)| r)
    }

    /// Whether the host mask of this runtime's host-rooted sandboxes is still the one a walk
    /// of the host would plan now (the remembered walk's checks, about 0.7 ms; a walk when
    /// they fail). A runtime keeps the mask of its first host-rooted sandbox for its whole
    /// life; a long-lived process that must see the host as a new process would (`engine
    /// sandbox daemon`) asks this before it makes a sandbox, and starts a new runtime on a no.
    /// A runtime that has made no host-rooted sandbox answers yes.
    pub fn host_mask_current(&self) -> Result<bool, SandboxError> {
        let Some(digest) = lock(&self.inner.host_mask).as_ref().map(|(_, d)| d.clone()) else {
            return Ok(true);
        };
        let cache_dir = state::digest_cache_dir(&self.inner.state);
        let (plan, _) = crate::host_walk::with_host(&cache_dir, "host-mask", plan_host_mask)?;
        Ok(layers::host_digest(&plan.ops, &cache_dir) == digest)
    }

    /// How a host mask made now would reach an init cloned before it: from the store (no
    /// mount needed), or mounted on the run's shared mount point, made now if it is not yet.
    fn prepare_host_mask(&self) -> Result<MaskPlace, SandboxError> {
        if lock(&self.inner.mask_store).is_some() {
            return Ok(MaskPlace::Store);
        }
        self.share_host_mask_point()?;
        Ok(MaskPlace::RunTmpfs)
    }

    /// Resolve `spec` and cache it, except a host root made from a remembered plan whose
    /// checks are left to the caller (`defer`, see [`PendingMask`]): that one is returned
    /// with them and cached only by [`Runtime::accept_host_mask`].
    fn resolve_uncached(
        &self,
        spec: &RootfsSpec,
        cache: &mut HashMap<RootfsSpec, Rootfs>,
        place: Option<MaskPlace>,
        defer: bool,
    ) -> Result<(Rootfs, Option<PendingMask>), SandboxError> {
        let host_root = |mask: &Path, digest: &str| Rootfs {
            lowers: vec![mask.to_string_lossy().into_owned(), "/".into()],
            digest: digest.to_string(),
        };
        let r = match spec {
            RootfsSpec::Host => {
                let place = match place {
                    Some(p) => p,
                    None => self.prepare_host_mask()?,
                };
                match self.host_mask(place, defer)? {
                    HostMask::Ready(mask, digest) => host_root(&mask, &digest),
                    HostMask::Pending(p) => return Ok((host_root(&p.dir, &p.digest), Some(p))),
                }
            }
            RootfsSpec::Dir(p) => {
                let p = p.canonicalize().map_err(|e| LayerError::BadDirectory {
                    path: p.clone(),
                    reason: e.to_string(),
                })?;
                Rootfs {
                    digest: layers::dir_digest(&p)?,
                    lowers: vec![p.to_string_lossy().into_owned()],
                }
            }
            RootfsSpec::Oci(p) => {
                let store = self.inner.state.join("layers");
                let img = crate::oci::import(p, &store, &crate::oci::ImportLimits::default())
                    .map_err(|source| LayerError::Oci {
                        path: p.clone(),
                        source,
                    })?;
                store_rootfs(&store, &img.layers)
            }
            RootfsSpec::Docker(image) => {
                let store = self.inner.state.join("layers");
                let layers = docker_layers(image, &store, &self.inner.state).map_err(|source| {
                    LayerError::Docker {
                        image: image.clone(),
                        source: Box::new(source),
                    }
                })?;
                store_rootfs(&store, &layers)
            }
            RootfsSpec::Debootstrap(suite) => {
                let built =
                    crate::debootstrap::ensure(&self.inner.state, suite).map_err(|source| {
                        LayerError::Debootstrap {
                            suite: suite.to_string(),
                            source: Box::new(source),
                        }
                    })?;
                Rootfs {
                    lowers: vec![built.rootfs.to_string_lossy().into_owned()],
                    digest: built.digest,
                }
            }
        };
        cache.insert(spec.clone(), r.clone());
        Ok((r, None))
    }

    /// A pending host mask whose checks held: from now on the runtime's own.
    fn accept_host_mask(&self, p: PendingMask, rootfs: Rootfs) {
        // The order of `resolve_uncached`: the rootfs cache, then the mask.
        let mut cache = lock(&self.inner.rootfs);
        let mut guard = lock(&self.inner.host_mask);
        // Held either way: this sandbox's overlay reads the entry live.
        lock(&self.inner.mask_held).push(p.held);
        if guard.is_none() {
            *guard = Some((p.dir, p.digest));
            cache.insert(RootfsSpec::Host, rootfs);
        }
    }

    /// Make `<run>/hostmask` a shared mount point (bound onto itself), once per run, before
    /// the first host-rooted sandbox's init is cloned: init's copy of it is then a peer, so
    /// the mask mounted there afterwards (while init execs, see [`Runtime::create`]) appears
    /// in init's mount namespace too. Init makes everything private before it reads its plan
    /// (which is sent after the mask is complete and read-only), so nothing propagates later.
    fn share_host_mask_point(&self) -> Result<(), SandboxError> {
        let mut done = lock(&self.inner.host_mask_point);
        if *done {
            return Ok(());
        }
        let dir = self.inner.run_dir.join("hostmask");
        std::fs::create_dir_all(&dir).map_err(|source| SandboxError::Spawn {
            what: "creating the host mask directory",
            source,
        })?;
        use nix::mount::MsFlags;
        let none: Option<&str> = None;
        nix::mount::mount(Some(&dir), &dir, none, MsFlags::MS_BIND, none)
            .and_then(|()| nix::mount::mount(none, &dir, none, MsFlags::MS_SHARED, none))
            .map_err(|e| SandboxError::Spawn {
                what: "making the host mask's mount point shared",
                source: e.into(),
            })?;
        *done = true;
        Ok(())
    }

    /// The host layer's mask: an entry of the mask store (`mask_store.rs`), else a small
    /// tmpfs in the host mount namespace, built once per run on the shared mount point of
    /// [`Runtime::share_host_mask_point`]. `place` is where the inits cloned before this
    /// call can see it (see [`Runtime::prepare_host_mask`]).
    /// (Neither can live on the root filesystem: overlayfs refuses a lower layer nested
    /// inside another lower layer of its filesystem, and the host's `/` is one.)
    ///
    /// With `defer` and the store, a remembered plan's checks are not run here: the mask is
    /// returned pending, with them, and nothing is cached (see [`PendingMask`]).
    fn host_mask(&self, place: MaskPlace, defer: bool) -> Result<HostMask, SandboxError> {
        let mut guard = lock(&self.inner.host_mask);
        if let Some((dir, digest)) = guard.as_ref() {
            return Ok(HostMask::Ready(dir.clone(), digest.clone()));
        }
        // Plan once (one walk of the host) relative to `/`, so the digest does not depend on
        // where this run keeps the mask; then perform the plan under the mask directory.
        let t_walk = std::time::Instant::now();
        let cache_dir = state::digest_cache_dir(&self.inner.state);
        let planner = plan_host_mask;
        let (plan, source, deferred) = if defer && place == MaskPlace::Store {
            crate::host_walk::with_host_deferred(&cache_dir, "host-mask", planner)?
        } else {
            let (plan, source) = crate::host_walk::with_host(&cache_dir, "host-mask", planner)?;
            (plan, source, None)
        };
        let digest = layers::host_digest(&plan.ops, &cache_dir);
        let walk_us = t_walk.elapsed().as_micros() as u64;
        let t_build = std::time::Instant::now();
        if place == MaskPlace::Store {
            let store = lock(&self.inner.mask_store).clone();
            // With the walk's checks deferred, so is the entry's (the same rule: both hold
            // before the sandbox is handed out, and they run while its init sets up).
            let held = store.as_ref().map(|s| {
                if deferred.is_some() {
                    s.get_deferred(&plan).map(|(h, c)| (h, Some(c)))
                } else {
                    s.get_or_build(&plan).map(|h| (h, None))
                }
            });
            let (held, entry_check) = match held {
                Some(Ok(h)) => h,
                Some(Err(e)) => {
                    // This sandbox fails (its init cannot see a mask made elsewhere now); the
                    // next ones of this run build their mask in the run.
                    *lock(&self.inner.mask_store) = None;
                    return Err(LayerError::from(e).into());
                }
                None => return Err(LayerError::BadDirectory {
                    path: crate::mask_store::default_dir(),
                    reason:
                        "the host mask store was given up by another sandbox of this run; try again"
                            .into(),
                }
                .into()),
            };
            let dir = held.path.clone();
            tracing::debug!(
                walk_us,
                walk = ?source,
                checks_deferred = deferred.is_some(),
                store_us = t_build.elapsed().as_micros() as u64,
                ops = plan.ops.len(),
                entry = %dir.display(),
                "host mask from the store"
            );
            if let Some(checks) = deferred {
                return Ok(HostMask::Pending(PendingMask {
                    checks,
                    entry_check,
                    dir,
                    digest,
                    held,
                }));
            }
            lock(&self.inner.mask_held).push(held);
            *guard = Some((dir.clone(), digest.clone()));
            return Ok(HostMask::Ready(dir, digest));
        }
        let dir = self.inner.run_dir.join("hostmask");
        let plan = plan.rebased(&dir);
        let mut sys = RealSys;
        use crate::sys::Sys;
        sys.mount(
            "envfactory-hostmask",
            &dir,
            "tmpfs",
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            "mode=0755,size=4m",
        )
        .map_err(LayerError::from)?;
        if let Err(e) = plan.replay(&mut sys) {
            let _ = nix::mount::umount2(&dir, nix::mount::MntFlags::MNT_DETACH);
            return Err(LayerError::from(e).into());
        }
        // Read-only from now on.
        sys.mount(
            "",
            &dir,
            "",
            nix::mount::MsFlags::MS_REMOUNT
                | nix::mount::MsFlags::MS_RDONLY
                | nix::mount::MsFlags::MS_NOSUID
                | nix::mount::MsFlags::MS_NODEV,
            "",
        )
        .map_err(LayerError::from)?;
        tracing::debug!(
            walk_us,
            walk = ?source,
            build_us = t_build.elapsed().as_micros() as u64,
            ops = plan.ops.len(),
            "host mask built"
        );
        *guard = Some((dir.clone(), digest.clone()));
        Ok(HostMask::Ready(dir, digest))
    }

    fn seccomp(
        &self,
        cfg: &SandboxConfig,
    ) -> Result<Option<crate::seccomp::CompiledSeccomp>, SandboxError> {
        if !cfg.seccomp {
            return Ok(None);
        }
        let mut g = lock(&self.inner.seccomp);
        if g.is_none() {
            // Fail closed: a policy that does not load or compile stops every sandbox.
            let p = crate::seccomp::embedded_compiled(&state::digest_cache_dir(&self.inner.state))
                .map_err(|e| SandboxError::Policy(e.to_string()))?;
            *g = Some(p);
        }
        Ok(g.clone())
    }

    /// `<run>/sbx/<name>.init`: `"<pid> <start time>"` of a sandbox's init, for the reaper.
    pub(crate) fn init_record(&self, name: &str) -> PathBuf {
        self.inner.run_dir.join("sbx").join(format!("{name}.init"))
    }

    /// Create a sandbox: cgroups, namespaces, init, root filesystem.
    pub fn create(&self, cfg: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        self.create_with(cfg, true, self.inner.spares_on.load(Ordering::Relaxed))
    }

    /// [`Runtime::create`]; with `defer`, the checks of a remembered host plan run while init
    /// sets up (the sandbox is returned only if they hold, else it is dropped before any
    /// command ran in it and made again from a fresh walk); with `spares`, an init started
    /// ahead is used when one is ready.
    fn create_with(
        &self,
        cfg: &SandboxConfig,
        defer: bool,
        spares: bool,
    ) -> Result<Sandbox, SandboxError> {
        let t0 = std::time::Instant::now();
        cfg.validate().map_err(SandboxError::Config)?;
        self.admission().admit(&self.inner.live)?;
        // The place goes back if creation fails before the sandbox owns it.
        let mut place = Place(Some(self));
        let us = |t: std::time::Instant| t.elapsed().as_micros() as u64;
        let mask_place = if cfg.rootfs == RootfsSpec::Host {
            Some(self.prepare_host_mask()?)
        } else {
            None
        };
        // From the second sandbox on, inits and network namespaces are started ahead of
        // time: an init that waits for its plan is used if one is ready (else one is cloned
        // here, into a namespace made ahead if one is ready, else into a new one). (Not
        // counting a create made again inside this one: a one-shot's only sandbox may be made
        // twice, when the host changed since its walk was remembered.)
        if self.inner.counter.load(Ordering::Relaxed) > 0 && defer && spares {
            self.inner.netns.start();
            self.inner.inits.start();
        }
        // The reserve refills when this create ends, whichever way, or, when it took a spare,
        // after the sandbox's first request (see `InitReserve::refill`).
        let mut refill = Refill(Some(&self.inner.inits));
        let taken = if spares {
            self.inner.inits.take()
        } else {
            None
        };
        let mut guard = CreateGuard { dir: None };
        let t_cg = std::time::Instant::now();
        let spare = taken.is_some();
        let mut forked = false;
        let (name, dir, cgroup, cgroup_us, pid, host_sock, spawn_us, netns_ready) = match taken {
            Some(s) => {
                // Its name, directory and cgroups were made with it; its limits come now.
                if let Err(e) = s.cgroup.apply(&cfg.limits) {
                    s.discard();
                    return Err(e.into());
                }
                let cgroup_us = us(t_cg);
                (s.name, s.dir, s.cgroup, cgroup_us, s.pid, s.sock, 0, false)
            }
            None => {
                let n = self.inner.counter.fetch_add(1, Ordering::Relaxed);
                let name = format!("s{n}");
                let dir = self.inner.run_dir.join("sbx").join(&name);
                std::fs::create_dir(&dir).map_err(|source| SandboxError::Spawn {
                    what: "creating the sandbox directory",
                    source,
                })?;
                guard.dir = Some(dir.clone());
                let cgroup =
                    Cgroup::create(&self.inner.cgroups, &self.inner.run, &name, &cfg.limits)?;
                let cgroup_us = us(t_cg);
                let (host_sock, child_sock) =
                    UnixStream::pair().map_err(|source| SandboxError::Spawn {
                        what: "socketpair",
                        source,
                    })?;
                let netns = self.inner.netns.take();
                let netns_ready = netns.is_some();
                let t_spawn = std::time::Instant::now();
                forked = netns.is_none()
                    && self.inner.forked_inits.load(Ordering::Relaxed)
                    && crate::spawn_init::single_threaded();
                let pid = if forked {
                    crate::spawn_init::fork_init(&self.inner.init, child_sock.into())?
                } else {
                    crate::spawn_init::spawn_init(&self.inner.init, child_sock.into(), netns)?
                };
                let spawn_us = us(t_spawn);
                let _ = std::fs::write(self.init_record(&name), state::identity(pid));
                (
                    name,
                    dir,
                    cgroup,
                    cgroup_us,
                    pid,
                    host_sock,
                    spawn_us,
                    netns_ready,
                )
            }
        };
        let after = lock(&self.inner.after_init_start).take();
        if let Some(f) = after {
            f();
        }
        let no_root_yet = Rootfs {
            lowers: Vec::new(),
            digest: String::new(),
        };
        let mut sb = Sandbox::new(self.clone(), name, dir, host_sock, pid, cgroup, no_root_yet);
        guard.dir = None; // the sandbox's Drop owns cleanup from here on
        place.0 = None; // and its place among the live ones

        // Resolve the root and the policy while init execs and loads on another CPU (it waits
        // for its plan): the first sandbox of a process walks the host for the mask here. A
        // failure drops `sb`, which kills init and removes what was made for it.
        let t_resolve = std::time::Instant::now();
        let (base, pending) = {
            let mut cache = lock(&self.inner.rootfs);
            match cache.get(&cfg.rootfs) {
                Some(r) => (r.clone(), None),
                None => self.resolve_uncached(&cfg.rootfs, &mut cache, mask_place, defer)?,
            }
        };
        sb.set_rootfs(stack_layers(base.clone(), &cfg.layers)?);
        let seccomp = self.seccomp(cfg)?;
        let resolve_us = us(t_resolve);
        let t_setup = std::time::Instant::now();
        let set_up = match pending {
            None => sb.setup(cfg, seccomp),
            Some(p) => match sb.send_setup(cfg, seccomp) {
                Err(e) => Err(e),
                Ok(plan) => {
                    // Init sets up (no command can run before this returns) while the host is
                    // checked against the remembered plan.
                    if p.entry_check.is_some() {
                        self.inner
                            .deferred_entry_checks
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    if !p.holds() {
                        tracing::debug!(sandbox = %sb.name(), "{MADE_AGAIN_HOST_CHANGED}");
                        drop(sb);
                        // Its lock goes before the retry, whose prune can then remove an
                        // entry moved away as not matching.
                        drop(p);
                        return self.create_with(cfg, false, spares);
                    }
                    let r = sb.wait_setup();
                    if r.is_ok() {
                        self.accept_host_mask(p, base);
                    }
                    r.map(|done| (plan, done))
                }
            },
        };
        let (plan, done) = match set_up {
            Ok(done) => done,
            Err(e) => {
                if spare && matches!(e, SandboxError::Dead) {
                    // A spare that died just before it was taken (killed from outside, between
                    // its check and its plan): once more with an init cloned for it. A plan that
                    // cannot be set up is not retried.
                    tracing::debug!(sandbox = %sb.name(), error = %e, "a spare init failed its setup: made again with a cloned init");
                    drop(sb);
                    return self.create_with(cfg, defer, false);
                }
                return Err(e);
            }
        };
        // The next spares make this plan's root ahead (`init_reserve.rs`).
        if spares {
            self.inner.inits.expect(plan);
        }
        if done.root_made_ahead {
            self.inner.roots_made_ahead.fetch_add(1, Ordering::Relaxed);
        }
        if done.root_undone {
            self.inner.roots_undone.fetch_add(1, Ordering::Relaxed);
        }
        if spare {
            refill.0 = None;
            sb.defer_refill();
        }
        tracing::debug!(
            sandbox = %sb.name(),
            pid,
            cgroup_us,
            spawn_us,
            spare,
            root_made_ahead = done.root_made_ahead,
            root_undone = done.root_undone,
            forked,
            netns_ready,
            resolve_us,
            setup_us = us(t_setup),
            total_us = us(t0),
            "sandbox ready"
        );
        Ok(sb)
    }
}

/// Put extra read-only layers above a resolved rootfs; the digest covers their names.
fn stack_layers(base: Rootfs, layers: &[PathBuf]) -> Result<Rootfs, SandboxError> {
    if layers.is_empty() {
        return Ok(base);
    }
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(base.digest.as_bytes());
    let mut lowers = Vec::with_capacity(layers.len() + base.lowers.len());
    for l in layers {
        if !l.is_absolute() || !l.is_dir() {
            return Err(LayerError::BadDirectory {
                path: l.clone(),
                reason: "an extra layer must be an existing absolute directory".into(),
            }
            .into());
        }
        h.update(b"\n");
        h.update(l.as_os_str().as_encoded_bytes());
        lowers.push(l.to_string_lossy().into_owned());
    }
    lowers.extend(base.lowers);
    Ok(Rootfs {
        lowers,
        digest: format!("sha256-{}", hex::encode(h.finalize())),
    })
}

/// One socket per live sandbox: lift the soft descriptor limit to the hard one (allowed
/// without privilege), so a thousand sandboxes fit.
fn raise_nofile() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                tracing::debug!(error = %e, soft, hard, "could not raise RLIMIT_NOFILE");
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The waiting inits first: their records are in the run's directory.
        self.inits.stop();
        // The host mask's tmpfs and the shared mount point under it are both listed (one
        // path twice): each unmount removes the topmost. A run that used the mask store
        // mounted nothing in this namespace: no need to read the mount table.
        if *lock(&self.host_mask_point) {
            for m in state::mounts_under(&self.run_dir) {
                let _ = nix::mount::umount2(&m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        for (_, root) in self.cgroups.roots() {
            let _ = cgroup::remove(&root.join(cgroup::TOP).join(&self.run));
        }
        let _ = std::fs::remove_dir_all(&self.run_dir);
        tracing::debug!(run = %self.run, "runtime cleaned up");
    }
}

/// A host mask, resolved.
enum HostMask {
    Ready(PathBuf, String),
    Pending(PendingMask),
}

/// The host mask's plan, relative to `/` (so its digest does not depend on where a run keeps
/// the mask).
fn plan_host_mask(host: &dyn layers::HostView) -> Result<crate::sys::Recorder, LayerError> {
    let mut plan = crate::sys::Recorder::default();
    layers::plan_host_mask(&mut plan, Path::new("/"), host)?;
    Ok(plan)
}

/// A host mask from a remembered plan whose checks have not run yet
/// (`host_walk::with_host_deferred`), nor the store entry's check against that plan
/// (`MaskStore::get_deferred`): init may mount it, but no command may run on it until they
/// hold; only then is it cached ([`Runtime::accept_host_mask`]).
struct PendingMask {
    checks: crate::host_walk::Deferred,
    entry_check: Option<crate::mask_store::MaskCheck>,
    dir: PathBuf,
    digest: String,
    held: crate::mask_store::HeldMask,
}

impl PendingMask {
    /// The plan is the one a walk would give now, and the entry is exactly what it makes.
    fn holds(&self) -> bool {
        self.checks.holds() && self.entry_check.as_ref().is_none_or(|c| c.holds())
    }
}

/// Where a host mask made after an init was cloned is visible to that init.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MaskPlace {
    /// An entry of the mask store: on a filesystem every init's mount namespace shares.
    Store,
    /// Mounted on the run's shared mount point, which the init's namespace is a peer of.
    RunTmpfs,
}

/// A live sandbox's place, given back on drop unless a sandbox took it over.
struct Place<'a>(Option<&'a Runtime>);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if let Some(rt) = self.0 {
            rt.release();
        }
    }
}

/// Lets the init reserve refill when dropped (unless disarmed).
struct Refill<'a>(Option<&'a crate::init_reserve::InitReserve>);

impl Drop for Refill<'_> {
    fn drop(&mut self) {
        if let Some(r) = self.0 {
            r.refill();
        }
    }
}

struct CreateGuard {
    dir: Option<PathBuf>,
}

impl Drop for CreateGuard {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Layers of the store (ids bottom first) as a rootfs: lowers topmost first, and a digest of
/// the ids (each is the digest of its content).
fn store_rootfs(store: &std::path::Path, layers: &[String]) -> Rootfs {
    use sha2::Digest;
    let lowers = layers
        .iter()
        .rev()
        .map(|id| store.join(id).to_string_lossy().into_owned())
        .collect();
    let mut h = sha2::Sha256::new();
    for l in layers {
        h.update(l.as_bytes());
        h.update(b"\n");
    }
    Rootfs {
        lowers,
        digest: format!("sha256-{}", hex::encode(h.finalize())),
    }
}

/// The layers of a Docker image, exported from the daemon of `DOCKER_HOST` once per image id
/// (`<state>/docker-images/<id>.json` remembers them).
#[cfg(feature = "docker")]
fn docker_layers(
    image: &str,
    store: &std::path::Path,
    state: &std::path::Path,
) -> Result<Vec<String>, crate::docker::DockerError> {
    let client = crate::docker::Client::from_env()?;
    let img = crate::docker::import_image(
        &client,
        image,
        store,
        &state.join("docker-images"),
        &crate::oci::ImportLimits::default(),
    )?;
    Ok(img.layers)
}

#[cfg(not(feature = "docker"))]
fn docker_layers(
    _image: &str,
    _store: &std::path::Path,
    _state: &std::path::Path,
) -> Result<Vec<String>, crate::docker::DockerError> {
    Err(crate::docker::DockerError::Unsupported)
}
