//! Synthesis: layers written by the builder appear in a sandbox with overlay semantics, the
//! bytes are deterministic, and the instance cache is content-addressed and bounded.

use crate::common;

use engine::instance::{BaseView, Builder, Plan, Resources};
use engine::synth::{Cache, Origin};
use sandbox::{ExecRequest, SandboxConfig};

/// The tests of this file run one at a time, and the exact-LRU-order test runs alone in its own
/// process ([`common::isolated`]). A cache entry's hold is a `flock` on its manifest's open
/// file description, which a process forked meanwhile shares until it execs or exits;
/// eviction then skips the entry as held (the safe direction). A sandbox created by a parallel
/// test (of any module of this binary) would make the exact LRU order asserted there flaky
/// (seen in CI).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn sh(sb: &mut sandbox::Sandbox, cmd: &str) -> (i32, String) {
    let r = sb.exec(&ExecRequest::shell(cmd)).unwrap();
    (
        r.exit_code(),
        String::from_utf8_lossy(&r.stdout).trim().to_string(),
    )
}

#[test]
fn builder_layer_is_seen_in_a_sandbox_with_overlay_semantics() {
    require_root!();
    let _serial = serial();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let base = BaseView::new(&rootfs);
    let mut b = Builder::new(&base, 7, Resources::default());
    // Reads see the base through the host mask: /etc/shadow is hidden, /etc/passwd is not.
    assert!(b.read("/etc/passwd").is_some());
    assert!(b.read("/etc/shadow").is_none());
    assert!(b.which("tar", engine::instance::DEFAULT_PATH).is_some());
    b.write("/srv/app/config.ini", "a = 1\n", 0o640).unwrap();
    b.remove("/usr/bin/tar").unwrap();
    b.chmod("/usr/bin/gzip", 0o644).unwrap();
    b.symlink("/usr/local/bin/tarx", "/bin/false").unwrap();
    assert!(b.which("tar", engine::instance::DEFAULT_PATH).is_none() || b.exists("/bin/tar"));
    assert_eq!(b.read("/srv/app/config.ini").unwrap(), b"a = 1\n");
    assert!(b.list("/srv").contains(&"app".to_string()));
    let tmp = tempfile::tempdir().unwrap();
    // The layer must not be nested in `/` (a lower layer): put it on its own tmpfs.
    nix::mount::mount(
        Some("t"),
        tmp.path(),
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=16m"),
    )
    .unwrap();
    let layer = tmp.path().join("layer");
    let r = {
        b.layer.materialize(&layer, &base).unwrap();
        let mut sb = rt
            .create(&SandboxConfig {
                layers: vec![layer.clone()],
                ..SandboxConfig::default()
            })
            .unwrap();
        let cfg = sh(
            &mut sb,
            "stat -c '%a %U' /srv/app/config.ini; cat /srv/app/config.ini",
        );
        let tar = sh(&mut sb, "test -e /usr/bin/tar; echo $?");
        let gz = sh(&mut sb, "stat -c %a /usr/bin/gzip");
        let ls = sh(&mut sb, "readlink /usr/local/bin/tarx");
        let usr = sh(
            &mut sb,
            "stat -c %a /usr/bin; test -x /usr/bin/find && echo ok",
        );
        drop(sb);
        (cfg, tar, gz, ls, usr)
    };
    let _ = nix::mount::umount2(tmp.path(), nix::mount::MntFlags::MNT_DETACH);
    let (cfg, tar, gz, ls, usr) = r;
    assert_eq!(cfg.1, "640 root\na = 1");
    assert_eq!(tar.1, "1");
    assert_eq!(gz.1, "644");
    assert_eq!(ls.1, "/bin/false");
    assert_eq!(usr.1, "755\nok");
}

#[test]
fn cache_is_content_addressed_deterministic_and_bounded() {
    require_root!();
    if !common::isolated("synth::cache_is_content_addressed_deterministic_and_bounded") {
        return;
    }
    let _serial = serial();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 2, 1 << 30).unwrap();
    let plan = |seed| Plan {
        task: None,
        ..Plan::for_task("none", seed, vec![])
    };
    let a = cache.get_or_build(&plan(1), &rootfs).unwrap();
    assert_eq!(a.origin, Origin::Built);
    let a2 = cache.get_or_build(&plan(1), &rootfs).unwrap();
    assert_eq!(a2.origin, Origin::Cached);
    assert_eq!(a.instance.id, a2.instance.id);
    let d1 = common::tree_digest(&a.instance.layer);
    drop((a, a2));
    let b = cache.get_or_build(&plan(2), &rootfs).unwrap();
    assert_ne!(
        b.instance.id,
        engine::instance::instance_id(&plan(1), &rootfs.digest)
    );
    drop(b);
    let _c = cache.get_or_build(&plan(3), &rootfs).unwrap();
    // Bounded at 2 entries: the least recently used (seed 1) went.
    let ids = cache.ids();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(!ids.contains(&engine::instance::instance_id(&plan(1), &rootfs.digest)));
    // Rebuilt, it has the same bytes.
    let a3 = cache.get_or_build(&plan(1), &rootfs).unwrap();
    assert_eq!(a3.origin, Origin::Built);
    assert_eq!(common::tree_digest(&a3.instance.layer), d1);
}

#[test]
fn held_entries_are_not_evicted_and_concurrent_builds_agree() {
    require_root!();
    let _serial = serial();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let st = common::TempState::new();
    let cache = Cache::open_with(st.path(), 1, 1 << 30).unwrap();
    let plan = |seed| Plan {
        task: None,
        ..Plan::for_task("none", seed, vec![])
    };
    let held = cache.get_or_build(&plan(10), &rootfs).unwrap();
    let _other = cache.get_or_build(&plan(11), &rootfs).unwrap();
    assert!(held.instance.layer.is_dir(), "a held instance was evicted");
    drop((held, _other));
    let ids: Vec<String> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let c = Cache::open_with(st.path(), 8, 1 << 30).unwrap();
                    c.get_or_build(&plan(12), &rootfs).unwrap().instance.id
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn crashed_builds_are_swept_and_other_processes_builds_are_counted() {
    require_root!();
    let _serial = serial();
    let rt = common::runtime();
    let rootfs = rt.resolve(&sandbox::RootfsSpec::Host).unwrap();
    let st = common::TempState::new();
    let a = Cache::open_with(st.path(), 3, 1 << 30).unwrap();
    // What a `kill -9` in the middle of a build leaves: a partial layer and manifest.
    std::fs::create_dir_all(a.dir().join(".tmp-dead-999999/usr/bin")).unwrap();
    std::fs::write(a.dir().join(".tmp-dead-999999/usr/bin/x"), "partial").unwrap();
    std::fs::write(a.dir().join(".tmp-dead.json"), "{").unwrap();
    let plan = |seed| Plan {
        task: None,
        ..Plan::for_task("none", seed, vec![])
    };
    let id = |seed| engine::instance::instance_id(&plan(seed), &rootfs.digest);
    drop(a.get_or_build(&plan(1), &rootfs).unwrap());
    drop(a.get_or_build(&plan(2), &rootfs).unwrap());
    // Another handle (another process: its own index) opens the cache: the leftovers go.
    let b = Cache::open_with(st.path(), 3, 1 << 30).unwrap();
    let names: Vec<String> = std::fs::read_dir(b.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with(".tmp-")), "{names:?}");
    drop(b.get_or_build(&plan(3), &rootfs).unwrap());
    drop(b.get_or_build(&plan(4), &rootfs).unwrap());
    // `a` did not build 3 and 4, yet counts them: its next build evicts down to 3 entries,
    // the least recently used first (1, then 2).
    drop(a.get_or_build(&plan(5), &rootfs).unwrap());
    let ids = a.ids();
    assert_eq!(ids.len(), 3, "{ids:?}");
    for (seed, kept) in [(1, false), (2, false), (3, true), (4, true), (5, true)] {
        assert_eq!(ids.contains(&id(seed)), kept, "seed {seed}: {ids:?}");
    }
}
