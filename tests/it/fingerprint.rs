//! Fingerprints: plausible values on the host rootfs, the right features move when an instance
//! is perturbed, and the shipped data files are current.

use crate::common;

use engine::fingerprint::{self, Fingerprint, FEATURES, SCHEMA};
use engine::instance::{BaseView, Builder, Resources};
use sandbox::SandboxConfig;

/// A tmpfs for layers (overlayfs refuses a layer nested in `/`, a lower of the host base),
/// unmounted when dropped.
struct LayerDir {
    dir: tempfile::TempDir,
}

impl LayerDir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        nix::mount::mount(
            Some("fp-layers"),
            dir.path(),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some("size=16m"),
        )
        .unwrap();
        Self { dir }
    }
}

impl Drop for LayerDir {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn host() -> (sandbox::Runtime, Fingerprint) {
    let rt = common::runtime();
    let start = std::time::Instant::now();
    let fp = fingerprint::fingerprint_rootfs(&rt, &sandbox::RootfsSpec::Host).unwrap();
    eprintln!(
        "host fingerprint (sandbox creation included) in {:?}",
        start.elapsed()
    );
    (rt, fp)
}

#[test]
fn host_fingerprint_is_plausible() {
    require_root!();
    let (_rt, fp) = host();
    let g = |n: &str| {
        fp.get(n)
            .unwrap_or_else(|| panic!("{n} unmeasured: {:?}", fp.notes))
    };
    assert_eq!(fp.schema, SCHEMA);
    assert_eq!(fp.vector.len(), FEATURES.len());
    assert_eq!(fp.features.len(), FEATURES.len());
    // The default sandbox: 64 MiB writable layer, almost empty, default limits and variables.
    assert_eq!(g("disk_total_bytes"), (64u64 << 20) as f64);
    assert!(g("disk_used_frac") < 0.5);
    assert!(g("inodes_total") > 0.0);
    assert_eq!(g("nofile"), 1024.0);
    assert_eq!(g("path_set"), 1.0);
    assert_eq!(g("path_missing_dirs"), 0.0);
    assert_eq!(g("path_standard_frac"), 1.0);
    assert!(g("tools_available") >= 20.0, "{:?}", fp.observed);
    assert!(!fp.observed.missing_tools.contains(&"sh".to_string()));
    assert!(!fp.observed.missing_tools.contains(&"tar".to_string()));
    assert_eq!(g("tools_nonstandard_location"), 0.0);
    assert!(g("dpkg_packages") > 50.0);
    assert!(g("dpkg_essential") >= 10.0);
    assert!(g("dpkg_verify_failures") >= 0.0);
    assert_eq!(g("locale_installed"), 1.0, "{:?}", fp.observed);
    assert!(g("locales_available") >= 2.0);
    assert_eq!(g("home_is_dir"), 1.0);
    assert_eq!(g("tmpdir_ok"), 1.0);
    assert_eq!(g("tmp_sticky_world_writable"), 1.0);
    assert_eq!(g("clock_offset_s"), 0.0);
    assert_eq!(g("processes"), 0.0);
    assert_eq!(g("zombies"), 0.0);
    assert_eq!(g("listening_tcp"), 0.0);
    assert_eq!(g("env_nonstandard"), 0.0);
    assert!(fp.observed.os.is_some());
    assert!(!fp.text().is_empty());
}

#[test]
fn perturbed_instance_differs_in_the_right_features() {
    require_root!();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let base = BaseView::new(&rootfs);
    let clean_env = SandboxConfig::default().env;
    let before = {
        let mut sb = rt.create(&SandboxConfig::default()).unwrap();
        fingerprint::measure(&mut sb, &clean_env).unwrap()
    };
    // A layer: tar removed, a shadowing gzip script early in PATH.
    let mut b = Builder::new(&base, 1, Resources::default());
    b.remove("/usr/bin/tar").unwrap();
    b.write("/usr/local/bin/gzip", "#!/bin/sh\nexit 1\n", 0o755)
        .unwrap();
    let layers = LayerDir::new();
    let layer = layers.dir.path().join("l");
    b.layer.materialize(&layer, &base).unwrap();
    // The instance's variables: a locale that is not installed, a bogus HOME, noise, and a
    // PATH with a missing directory.
    let mut env: Vec<String> = clean_env
        .iter()
        .filter(|kv| !kv.starts_with("LANG=") && !kv.starts_with("HOME="))
        .cloned()
        .collect();
    env.push("LANG=xx_YY.UTF-8".into());
    env.push("HOME=/nonexistent".into());
    env.push("FOO_NOISE=1".into());
    let after = {
        let mut sb = rt
            .create(&SandboxConfig {
                layers: vec![layer.clone()],
                ..SandboxConfig::default()
            })
            .unwrap();
        // A listening service and a zombie (its parent never reaps it).
        let r = sb
            .exec(&sandbox::ExecRequest::shell(
                "setsid perl -MIO::Socket::INET -e '$s=IO::Socket::INET->new(LocalAddr=>\"127.0.0.1\",LocalPort=>8123,Listen=>5,ReuseAddr=>1) or die; sleep 600' >/dev/null 2>&1 </dev/null &
                 setsid perl -e 'if (fork() == 0) { exit 0 } sleep 600' >/dev/null 2>&1 </dev/null &
                 for i in $(seq 1 100); do grep -q ':1FBB 00000000:0000 0A' /proc/net/tcp && break; sleep 0.05; done",
            ))
            .unwrap();
        assert!(r.success());
        let mut fp = None;
        for _ in 0..100 {
            let f = fingerprint::measure(&mut sb, &env).unwrap();
            if f.get("zombies") == Some(1.0) {
                fp = Some(f);
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        fp.expect("the zombie appears")
    };
    let d = |n: &str| (before.get(n).unwrap(), after.get(n).unwrap());
    assert_eq!(d("tools_available").0 - d("tools_available").1, 1.0);
    assert!(after.observed.missing_tools.contains(&"tar".to_string()));
    assert_eq!(d("tools_nonstandard_location"), (0.0, 1.0));
    assert_eq!(d("tools_scripts").1 - d("tools_scripts").0, 1.0);
    assert_eq!(d("locale_installed"), (1.0, 0.0));
    assert_eq!(d("home_is_dir"), (1.0, 0.0));
    assert_eq!(d("env_nonstandard"), (0.0, 1.0));
    assert_eq!(d("listening_tcp"), (0.0, 1.0));
    assert_eq!(after.observed.listening_ports, vec![8123]);
    assert_eq!(d("zombies"), (0.0, 1.0));
    assert!(after.get("processes").unwrap() >= 3.0);
    // dpkg --verify sees tar's files gone.
    assert!(d("dpkg_verify_missing").1 > d("dpkg_verify_missing").0);
    // Untouched features stay.
    assert_eq!(d("path_missing_dirs"), (0.0, 0.0));
    assert_eq!(d("nofile"), (1024.0, 1024.0));
    let changed: Vec<&str> = before.diff(&after).iter().map(|c| c.0).collect();
    assert!(!changed.contains(&"path_entries"), "{changed:?}");
}

/// The real set (issue 11 item 3): at least 50 distinct systems, each with its provenance,
/// measured with the current feature set. No debootstrap here: the files are data
/// (`engine/data/fingerprints/build.sh` makes them).
#[test]
fn shipped_fingerprints_are_current() {
    let shipped = fingerprint::shipped();
    assert!(shipped.len() >= 50, "{} real fingerprints", shipped.len());
    let mut seen = std::collections::BTreeMap::new();
    let mut suites = std::collections::BTreeSet::new();
    let mut services = 0;
    for (name, v) in &shipped {
        assert_eq!(v["name"].as_str(), Some(*name), "{name}: name");
        let p = &v["provenance"];
        for k in [
            "rootfs", "where", "when", "how", "kernel", "machine", "source",
        ] {
            assert!(
                p[k].as_str().is_some_and(|s| !s.is_empty()),
                "{name}: provenance.{k}"
            );
        }
        if p["source"] == "debootstrap" {
            for k in [
                "suite",
                "variant",
                "role",
                "packages",
                "mirror",
                "debootstrap",
                "built",
            ] {
                assert!(
                    p[k].as_str().is_some_and(|s| !s.is_empty()),
                    "{name}: provenance.{k}"
                );
            }
            assert!(
                p["command"][0]
                    .as_str()
                    .is_some_and(|c| c.starts_with("debootstrap ")),
                "{name}: provenance.command"
            );
            suites.insert(p["suite"].as_str().unwrap().to_string());
        }
        let fp = fingerprint::shipped_fingerprint(name).unwrap();
        assert_eq!(
            fp.schema, SCHEMA,
            "{name}: measured with an older feature set"
        );
        assert_eq!(fp.vector.len(), FEATURES.len(), "{name}");
        for (n, _) in FEATURES {
            assert!(fp.features.contains_key(*n), "{name}: {n}");
        }
        assert!(fp.get("tools_available").unwrap() > 10.0, "{name}");
        if p["service"].is_string() {
            // A role with a service was measured with it running.
            assert!(fp.get("processes").unwrap() >= 1.0, "{name}: no process");
            services += 1;
        }
        let key = serde_json::to_string(&(&fp.vector, &fp.observed)).unwrap();
        if let Some(other) = seen.insert(key, name) {
            panic!("{name} and {other} are the same system");
        }
    }
    assert!(suites.len() >= 3, "suites {suites:?}");
    assert!(services >= 10, "{services} systems with a service running");
    let host = fingerprint::shipped_fingerprint("host-debian12").unwrap();
    let min = fingerprint::shipped_fingerprint("debootstrap-bookworm-minbase").unwrap();
    assert!(host.get("dpkg_packages").unwrap() > min.get("dpkg_packages").unwrap());
}

// The real set is re-measured by `engine/data/fingerprints/build.sh` (root; debootstrap,
// apt and the release engine; docs/fingerprints.md), no longer by an ignored test.

#[test]
fn fingerprint_of_a_live_instance_shows_its_perturbations() {
    require_root!();
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = engine::synth::Cache::open(state.path()).unwrap();
    let plan = |specs: &[&str]| engine::instance::Plan {
        base: "host".into(),
        task: None,
        perturbations: specs
            .iter()
            .map(|s| engine::perturb::parse_spec(s).unwrap())
            .collect(),
        seed: 3,
        resources: Resources::default(),
        tools: Vec::new(),
    };
    let measure = |specs: &[&str], zombies: f64| {
        let held = engine::running::synthesize(&rt, &cache, &plan(specs)).unwrap();
        let mut running = engine::running::RunningInstance::start(&rt, held).unwrap();
        // Start steps detach their processes; wait until the zombies are there.
        for _ in 0..100 {
            let fp = fingerprint::fingerprint_running(&mut running).unwrap();
            if fp.get("zombies") == Some(zombies) {
                return fp;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("no {zombies} zombies in {specs:?}");
    };
    let clean = measure(&[], 0.0);
    let bent = measure(
        &[
            "tool-missing:tool=gzip",
            "locale-drift:locale=de_DE.UTF-8",
            "zombies:count=3",
            "fd-limit:nofile=64",
            "dns-broken:how=garbage",
        ],
        3.0,
    );
    assert!(bent.observed.missing_tools.contains(&"gzip".to_string()));
    assert_eq!(
        clean.get("tools_available").unwrap() - bent.get("tools_available").unwrap(),
        1.0
    );
    assert_eq!(bent.observed.effective_locale, "de_DE.UTF-8");
    assert_eq!(clean.get("locale_installed"), Some(1.0));
    assert_eq!(bent.get("locale_installed"), Some(0.0));
    assert_eq!(bent.get("nofile"), Some(64.0));
    assert_eq!(clean.get("nofile"), Some(1024.0));
    assert!(bent.get("processes").unwrap() >= 4.0);
    assert_eq!(clean.get("resolv_valid"), Some(1.0));
    assert_eq!(bent.get("resolv_valid"), Some(0.0));
    let changed: Vec<&str> = clean.diff(&bent).iter().map(|c| c.0).collect();
    for same in [
        "path_entries",
        "disk_total_bytes",
        "home_is_dir",
        "listening_tcp",
    ] {
        assert!(!changed.contains(&same), "{same} changed: {changed:?}");
    }
}

#[test]
fn dpkg_verify_can_be_skipped() {
    require_root!();
    let rt = common::runtime();
    let mut sb = rt.create(&SandboxConfig::default()).unwrap();
    let opts = fingerprint::Options { dpkg_verify: false };
    let fp = fingerprint::measure_with(&mut sb, &SandboxConfig::default().env, opts).unwrap();
    assert_eq!(fp.get("dpkg_verify_failures"), None);
    assert!(fp.get("dpkg_packages").unwrap() > 50.0);
    let i = FEATURES
        .iter()
        .position(|f| f.0 == "dpkg_verify_failures")
        .unwrap();
    assert_eq!(fp.vector[i], -1.0);
    assert!(fp.notes.iter().any(|n| n.contains("skipped")));
}
