use super::*;
use crate::sys::Sys;
use std::os::unix::fs::PermissionsExt;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if me != 0 {
        eprintln!("skipped: needs root (trusted.* attributes)");
    }
    me == 0
}

/// A store in a fresh directory of `/dev/shm` (a tmpfs apart from `/`); `None` (the test is
/// skipped) without root.
fn store() -> Option<(tempfile::TempDir, MaskStore)> {
    if !root() {
        return None;
    }
    let t = tempfile::Builder::new()
        .prefix("envfactory-mask-store-test")
        .tempdir_in("/dev/shm")
        .unwrap();
    let dir = t.path().join("store");
    let s = MaskStore::open(&dir).expect("a fresh store on /dev/shm is usable");
    Some((t, s))
}

/// A plan shaped like `plan_host_mask`'s: a kept directory with a hidden file, a fresh
/// opaque directory, a hidden top-level entry.
fn plan(extra: &str) -> Recorder {
    let mut r = Recorder::default();
    r.mkdir(Path::new("/etc"), 0o755).unwrap();
    r.mknod_char(Path::new("/etc/shadow"), 0, 0, 0).unwrap();
    r.mknod_char(&Path::new("/etc").join(extra), 0, 0, 0)
        .unwrap();
    r.mkdir(Path::new("/tmp"), 0o1777).unwrap();
    r.set_xattr(Path::new("/tmp"), OPAQUE, b"y").unwrap();
    r.mknod_char(Path::new("/work"), 0, 0, 0).unwrap();
    r
}

fn ino(p: &Path) -> u64 {
    std::fs::symlink_metadata(p).unwrap().ino()
}

#[test]
fn a_stored_mask_is_its_plan_and_is_used_again() {
    let Some((_t, s)) = store() else { return };
    let p = plan("gshadow");
    let held = s.get_or_build(&p).unwrap();
    assert_eq!(held.path, s.dir().join(mask_id(&p.ops)));
    // Exactly what a mask made by replaying the plan holds (the per-run way).
    let fresh = tempfile::Builder::new().tempdir_in("/dev/shm").unwrap();
    let fresh_root = fresh.path().join("m");
    RealSys.mkdir(&fresh_root, 0o755).unwrap();
    p.rebased(&fresh_root).replay(&mut RealSys).unwrap();
    let want = Expected::of(&p.ops).unwrap();
    want.matches(&fresh_root).unwrap();
    want.matches(&held.path).unwrap();
    let m = std::fs::symlink_metadata(held.path.join("etc/shadow")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(&m.file_type()) && m.rdev() == 0);
    assert_eq!(
        crate::sys::get_xattr(&held.path.join("tmp"), OPAQUE).unwrap(),
        Some(b"y".to_vec())
    );
    let first = ino(&held.path);
    drop(held);
    let again = s.get_or_build(&p).unwrap();
    assert_eq!(
        ino(&again.path),
        first,
        "the entry is used again, not rebuilt"
    );
    // Another plan is another entry.
    let other = s.get_or_build(&plan("sudoers")).unwrap();
    assert_ne!(other.path, again.path);
}

#[test]
fn a_corrupted_entry_is_never_used() {
    let Some((_t, s)) = store() else { return };
    let p = plan("gshadow");
    let want = Expected::of(&p.ops).unwrap();
    type Corrupt = fn(&Path);
    let corruptions: &[(&str, Corrupt)] = &[
        ("a whiteout removed", |e| {
            std::fs::remove_file(e.join("etc/shadow")).unwrap()
        }),
        ("an entry added", |e| {
            std::fs::write(e.join("etc/passwd"), b"root::0:0::/:/bin/sh\n").unwrap()
        }),
        ("a mode changed", |e| {
            std::fs::set_permissions(e.join("tmp"), std::fs::Permissions::from_mode(0o755)).unwrap()
        }),
        ("the opaque marker removed", |e| {
            let p = std::ffi::CString::new(e.join("tmp").as_os_str().as_encoded_bytes()).unwrap();
            let n = std::ffi::CString::new(OPAQUE).unwrap();
            // SAFETY: valid C strings.
            assert_eq!(unsafe { libc::lremovexattr(p.as_ptr(), n.as_ptr()) }, 0);
        }),
        ("a redirect added", |e| {
            crate::sys::set_xattr(&e.join("etc"), "trusted.overlay.redirect", b"/root").unwrap()
        }),
        ("a whiteout made a file", |e| {
            std::fs::remove_file(e.join("work")).unwrap();
            std::fs::write(e.join("work"), b"").unwrap();
        }),
    ];
    for (what, corrupt) in corruptions {
        let held = s.get_or_build(&p).unwrap();
        let before = ino(&held.path);
        drop(held);
        corrupt(&s.dir().join(mask_id(&p.ops)));
        assert!(
            want.matches(&s.dir().join(mask_id(&p.ops))).is_err(),
            "{what}: the check sees it"
        );
        let held = s.get_or_build(&p).unwrap();
        want.matches(&held.path)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_ne!(ino(&held.path), before, "{what}: built again");
        drop(held);

        // The same corruption with the check left for later (`get_deferred`, what a runtime
        // uses while its init sets up): the check fails, and the entry is built again next.
        corrupt(&s.dir().join(mask_id(&p.ops)));
        let corrupted = ino(&s.dir().join(mask_id(&p.ops)));
        let (held, check) = s.get_deferred(&p).unwrap();
        assert!(!check.holds(), "{what}: the deferred check sees it");
        drop(held);
        let held = s.get_or_build(&p).unwrap();
        want.matches(&held.path)
            .unwrap_or_else(|e| panic!("{what}, deferred: {e}"));
        assert_ne!(ino(&held.path), corrupted, "{what}, deferred: built again");
    }
}

/// A deferred check is of the entry that was held: one put in its place afterwards (even a
/// correct one) fails it, and a held entry left alone passes it.
#[test]
fn a_deferred_check_is_of_the_entry_that_was_held() {
    let Some((_t, s)) = store() else { return };
    let p = plan("gshadow");
    drop(s.get_or_build(&p).unwrap());
    let (held, check) = s.get_deferred(&p).unwrap();
    assert!(check.holds(), "an untouched entry passes");
    // Swap in a copy built elsewhere: right contents, another directory.
    let elsewhere = s.dir().join(".swap");
    RealSys.mkdir(&elsewhere, 0o755).unwrap();
    p.rebased(&elsewhere).replay(&mut RealSys).unwrap();
    let moved = s.dir().join(".trash-swapped");
    let swapped_in = ino(&elsewhere);
    std::fs::rename(&held.path, &moved).unwrap();
    std::fs::rename(&elsewhere, &held.path).unwrap();
    assert!(
        !check.holds(),
        "a replaced entry fails the check of the held one"
    );
    assert_eq!(
        ino(&held.path),
        swapped_in,
        "the entry now at the path is someone else's: left where it is"
    );
}

#[test]
fn a_half_built_entry_is_never_used_and_crashed_builds_are_removed() {
    let Some((_t, s)) = store() else { return };
    let p = plan("gshadow");
    // A directory under the entry's name that lacks part of the plan (as if built by hand or
    // cut short): it fails the check and is replaced.
    let path = s.dir().join(mask_id(&p.ops));
    RealSys.mkdir(&path, 0o755).unwrap();
    RealSys.mkdir(&path.join("etc"), 0o755).unwrap();
    let held = s.get_or_build(&p).unwrap();
    Expected::of(&p.ops).unwrap().matches(&held.path).unwrap();
    assert!(held.path.join("etc/shadow").symlink_metadata().is_ok());
    // A crashed builder's temporary directory (its pid is gone) goes at the next prune; a
    // live builder's stays.
    let dead = s.dir().join(".tmp-999999999-1-0");
    let live = s.dir().join(format!(".tmp-{}-1-0", std::process::id()));
    std::fs::create_dir(&dead).unwrap();
    std::fs::create_dir(&live).unwrap();
    s.prune(KEEP, "");
    assert!(!dead.exists(), "a dead builder's leftovers are removed");
    assert!(live.exists(), "a live builder's directory is left alone");
    assert!(held.path.exists());
}

#[test]
fn pruning_keeps_the_newest_and_never_an_entry_in_use() {
    let Some((_t, s)) = store() else { return };
    let oldest = s.get_or_build(&plan("e0")).unwrap();
    for i in 1..KEEP + 3 {
        drop(s.get_or_build(&plan(&format!("e{i}"))).unwrap());
    }
    let names = || -> Vec<String> {
        std::fs::read_dir(s.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    // Another thread of this test process forking (its child holds copies of our
    // descriptors, locks included, until it execs) can make one prune skip an entry: prune
    // again until it settles.
    let settled = |want: usize| {
        crate::testing::eventually(2, || {
            s.prune(KEEP, "");
            names().len() == want
        })
    };
    settled(KEEP + 1);
    let names = names();
    assert!(
        names.iter().all(|n| !n.starts_with('.')),
        "no temporary left: {names:?}"
    );
    assert_eq!(
        names.len(),
        KEEP + 1,
        "the newest {KEEP} and the one in use: {names:?}"
    );
    assert!(oldest.path.exists(), "an entry in use is never pruned");
    Expected::of(&plan("e0").ops)
        .unwrap()
        .matches(&oldest.path)
        .unwrap();
    let newest = s.dir().join(mask_id(&plan(&format!("e{}", KEEP + 2)).ops));
    assert!(newest.exists());
    drop(oldest);
    drop(s.get_or_build(&plan("e-last")).unwrap());
    assert!(
        settled(KEEP),
        "{:?}",
        std::fs::read_dir(s.dir()).unwrap().count()
    );
}

#[test]
fn a_store_others_can_reach_or_on_the_root_filesystem_is_not_used() {
    let Some((t, _s)) = store() else { return };
    let open = t.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert!(MaskStore::open(&open).is_none(), "readable by others");
    let link = t.path().join("link");
    std::os::unix::fs::symlink(t.path().join("store"), &link).unwrap();
    assert!(MaskStore::open(&link).is_none(), "a symlink");
    let on_root = tempfile::Builder::new().tempdir_in("/var/tmp").unwrap();
    assert!(
        MaskStore::open(&on_root.path().join("store")).is_none(),
        "overlayfs refuses a lower layer in the root filesystem"
    );
}

#[test]
fn only_the_operations_of_a_mask_plan_can_be_stored() {
    let mut r = Recorder::default();
    r.symlink("/x", Path::new("/etc/y")).unwrap();
    assert!(matches!(
        Expected::of(&r.ops),
        Err(MaskStoreError::Unsupported("symlink"))
    ));
}
