//! Sandboxes on every root filesystem source: a directory, a `docker save` image and a Debian
//! suite made with debootstrap.
use crate::common::*;
use sandbox::testing::MINIMAL_ROOT as FILES;
use sandbox::{RootfsSpec, Runtime};
use sha2::Digest;
use std::path::Path;

fn add(b: &mut tar::Builder<Vec<u8>>, path: &str, data: &[u8], mode: u32, kind: tar::EntryType) {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(data.len() as u64);
    h.set_mtime(1_700_000_000);
    h.set_uid(0);
    h.set_gid(0);
    b.append_data(&mut h, path, data).unwrap();
}

fn base_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for d in [
        "bin",
        "lib",
        "lib/x86_64-linux-gnu",
        "lib64",
        "etc",
        "root",
        "tmp",
    ] {
        add(&mut b, d, b"", 0o755, tar::EntryType::Directory);
    }
    for (host, inside) in FILES {
        add(
            &mut b,
            inside,
            &std::fs::read(host).unwrap(),
            0o755,
            tar::EntryType::Regular,
        );
    }
    add(
        &mut b,
        "etc/motd",
        b"from the base layer\n",
        0o644,
        tar::EntryType::Regular,
    );
    add(
        &mut b,
        "etc/old",
        b"deleted above\n",
        0o644,
        tar::EntryType::Regular,
    );
    b.into_inner().unwrap()
}

fn top_layer() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    add(&mut b, "etc", b"", 0o755, tar::EntryType::Directory);
    add(&mut b, "etc/.wh.old", b"", 0o644, tar::EntryType::Regular);
    add(
        &mut b,
        "etc/motd",
        b"from the top layer\n",
        0o644,
        tar::EntryType::Regular,
    );
    b.into_inner().unwrap()
}

fn docker_save(path: &Path) {
    let layers = [base_layer(), top_layer()];
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|l| format!("sha256:{}", hex::encode(sha2::Sha256::digest(l))))
        .collect();
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let manifest = serde_json::json!([{
        "Config": "config.json", "RepoTags": ["test:1"], "Layers": ["l0/layer.tar", "l1/layer.tar"],
    }]);
    let mut b = tar::Builder::new(Vec::new());
    add(
        &mut b,
        "manifest.json",
        &serde_json::to_vec(&manifest).unwrap(),
        0o644,
        tar::EntryType::Regular,
    );
    add(
        &mut b,
        "config.json",
        &config,
        0o644,
        tar::EntryType::Regular,
    );
    add(
        &mut b,
        "l0/layer.tar",
        &layers[0],
        0o644,
        tar::EntryType::Regular,
    );
    add(
        &mut b,
        "l1/layer.tar",
        &layers[1],
        0o644,
        tar::EntryType::Regular,
    );
    std::fs::write(path, b.into_inner().unwrap()).unwrap();
}

fn minimal_config(spec: RootfsSpec) -> sandbox::SandboxConfig {
    let mut c = config();
    c.rootfs = spec;
    c.env = vec!["PATH=/bin".into(), "HOME=/root".into()];
    c
}

#[test]
fn a_docker_save_image_runs_with_its_whiteouts_applied() {
    require_root!();
    let _store = serial(&LAYER_STORE);
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("image.tar");
    docker_save(&img);
    let rt = runtime();
    let spec: RootfsSpec = format!("oci:{}", img.display()).parse().unwrap();
    let mut sb = rt.create(&minimal_config(spec.clone())).unwrap();
    let r = sh(&mut sb, "cat /etc/motd; cat /etc/old 2>/dev/null || echo old-is-gone; echo x > /root/y; cat /root/y");
    assert_eq!(
        out(&r),
        "from the top layer\nold-is-gone\nx\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    sb.reset().unwrap();
    assert_eq!(
        out(&sh(&mut sb, "cat /root/y 2>/dev/null || echo clean")),
        "clean\n"
    );
    // Same image, same digest; the layers are in the store.
    let again = rt.create(&minimal_config(spec)).unwrap();
    assert_eq!(again.rootfs_digest(), sb.rootfs_digest());
}

#[test]
fn a_directory_rootfs_is_used_in_place_and_never_written() {
    require_root!();
    let t = tempfile::tempdir().unwrap();
    let root = t.path().join("rootfs");
    for (host, inside) in FILES {
        let dst = root.join(inside);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(host, &dst).unwrap();
    }
    std::fs::create_dir_all(root.join("root")).unwrap();
    std::fs::write(root.join("marker"), "dir\n").unwrap();
    let rt = runtime();
    let mut sb = rt
        .create(&minimal_config(RootfsSpec::Dir(root.clone())))
        .unwrap();
    let r = sh(&mut sb, "cat /marker; echo changed > /marker; cat /marker");
    assert_eq!(out(&r), "dir\nchanged\n");
    assert_eq!(
        std::fs::read_to_string(root.join("marker")).unwrap(),
        "dir\n",
        "the directory layer is read-only"
    );
}

#[test]
fn a_corrupt_image_is_refused_and_leaves_nothing_behind() {
    require_root!();
    // It counts the shared layer store: no other test may import into it meanwhile.
    let _store = serial(&LAYER_STORE);
    let t = tempfile::tempdir().unwrap();
    let img = t.path().join("broken.tar");
    std::fs::write(&img, b"this is not a tarball").unwrap();
    let rt = runtime();
    let before = std::fs::read_dir(rt.state_dir().join("layers"))
        .unwrap()
        .count();
    let err = rt
        .create(&minimal_config(RootfsSpec::Oci(img.clone())))
        .unwrap_err();
    assert!(err.to_string().contains("broken.tar"), "{err}");
    assert_eq!(
        std::fs::read_dir(rt.state_dir().join("layers"))
            .unwrap()
            .count(),
        before
    );
    assert_eq!(
        std::fs::read_dir(rt.run_dir().join("sbx")).unwrap().count(),
        0,
        "no sandbox directory left"
    );
}

#[test]
fn the_host_layer_digest_is_stable_across_runs() {
    require_root!();
    let a = runtime()
        .create(&config())
        .unwrap()
        .rootfs_digest()
        .to_string();
    let b = runtime()
        .create(&config())
        .unwrap()
        .rootfs_digest()
        .to_string();
    assert!(a.starts_with("sha256-"), "{a}");
    assert_eq!(a, b, "the digest names the content, not the run");
}

/// The host mask comes from the store of built masks (`sandbox::mask_store`): nothing is
/// mounted in the run, the store's entry is the top layer, and it hides what a mask built in
/// the run hides (the runtime without a store builds that one, on its run's tmpfs).
#[test]
fn the_host_mask_from_the_store_hides_what_a_mask_built_in_the_run_hides() {
    require_root!();
    let probe = "test -e /etc/shadow && echo SHADOW; test -e /var/lib/envfactory && echo STATE; \
                 test -e /work && echo WORK; test -r /etc/passwd && echo passwd-ok; ls -a /tmp | wc -l";
    let rt = runtime();
    let mut sb = rt.create(&config()).unwrap();
    let stored = out(&sh(&mut sb, probe));
    let store = sandbox::mask_store::default_dir();
    let lowers = rt.resolve(&RootfsSpec::Host).unwrap().lowers;
    assert!(
        Path::new(&lowers[0]).starts_with(&store),
        "the top layer is the store's entry: {lowers:?}"
    );
    assert!(
        sandbox::state::mounts_under(rt.run_dir()).is_empty(),
        "nothing mounted in the run"
    );
    assert!(!rt.run_dir().join("hostmask").exists());
    drop(sb);

    let _starting = serial(&RUNTIME_START);
    let own = Runtime::with_mask_store(rt.state_dir(), init_program(), None).unwrap();
    let mut sb = own.create(&config()).unwrap();
    let built = out(&sh(&mut sb, probe));
    let lowers = own.resolve(&RootfsSpec::Host).unwrap().lowers;
    assert_eq!(Path::new(&lowers[0]), own.run_dir().join("hostmask"));
    assert_eq!(stored, built, "the same mask either way");
    assert_eq!(stored, "passwd-ok\n2\n", "private files hidden, /tmp fresh");
    assert_eq!(
        rt.resolve(&RootfsSpec::Host).unwrap().digest,
        own.resolve(&RootfsSpec::Host).unwrap().digest
    );
    let run = own.run_dir().to_path_buf();
    drop(sb);
    drop(own);
    assert!(
        sandbox::state::mounts_under(&run).is_empty() && !run.exists(),
        "the run's mask is unmounted and removed"
    );
}

/// `debootstrap:SUITE` with a stand-in for debootstrap (the real one, from the Debian archive,
/// is `harbor::base::from_debian_of_another_suite_is_that_suite_made_with_debootstrap`): a
/// failed build and one past its time limit leave nothing that is used, no mount and no
/// process (the stand-in's sleeper has left the build's process group: only the PID namespace
/// ends it); a finished one is tidied as the images are, published once, made once by two
/// builders at a time, and runs.
#[test]
fn a_debootstrapped_suite_is_used_only_once_finished_and_built_once() {
    use sandbox::debootstrap::{arch, Debootstrap, DebootstrapError, Suite};
    require_root!();
    let t = tempfile::tempdir().unwrap();
    let state = t.path().join("state");
    let fake = t.path().join("fake-debootstrap");
    let token = format!("fake-sleeper-{}", std::process::id());
    let copies = sandbox::testing::minimal_root_copies("4");
    std::fs::write(
        &fake,
        format!(
            "#!/bin/bash\nset -e\ndir={dir}\n\
             [ \"$1 $2 $4\" = '--force-check-gpg --variant=minbase trixie' ] || {{ echo \"bad arguments: $*\"; exit 9; }}\n\
             set -- \"$1\" \"$2\" \"$3\" \"$5\" \"$6\"\n\
             case \"$(cat $dir/mode)\" in\n\
             fail) mkdir -p \"$4/proc\"; mount -t tmpfs fake-proc \"$4/proc\"; echo \"E: Couldn't download packages: from $5\"; exit 1;;\n\
             hang) setsid bash -c 'exec -a {token} sleep 1000' & wait; exit 0;;\n\
             esac\n\
             echo run >> $dir/runs\nsleep 0.3\n{copies}\
             mkdir -p \"$4/etc/apt\" \"$4/var/lib/apt/lists/partial\" \"$4/root\"\n\
             echo 13.99 > \"$4/etc/debian_version\"\n\
             echo pkgs > \"$4/var/lib/apt/lists/deb.debian.org_Packages\"\n\
             echo 'nameserver 10.1.2.3' > \"$4/etc/resolv.conf\"\n\
             echo \"deb $5 trixie main\" > \"$4/etc/apt/sources.list\"\n\
             mkdir -p \"$4/dev/pts\"; mknod \"$4/dev/null\" c 1 3; ln -s /proc/self/fd \"$4/dev/fd\"\n",
            dir = t.path().display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mode = |m: &str| std::fs::write(t.path().join("mode"), m).unwrap();
    let db = Debootstrap {
        program: fake.clone(),
        mirror: "http://mirror.invalid/debian".into(),
        timeout: std::time::Duration::from_secs(3),
    };
    let trixie = Suite::parse("13").unwrap();
    let dir = state.join("debootstrap");
    let name = format!("trixie-{}", arch().unwrap());
    let nothing_used = |what: &str| {
        assert!(
            sandbox::debootstrap::cached(&state, &trixie)
                .unwrap()
                .is_none(),
            "{what}"
        );
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.ends_with(".lock") && !n.ends_with(".log"))
            .collect();
        assert!(left.is_empty(), "{what} left {left:?}");
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(&state.display().to_string()),
            "{what} left a mount: {mounts}"
        );
    };

    mode("fail");
    let e = db.ensure(&state, &trixie).unwrap_err();
    assert!(matches!(e, DebootstrapError::Failed { .. }), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("debootstrap of `trixie` from http://mirror.invalid/debian failed")
            && text.contains("E: Couldn't download packages: from http://mirror.invalid/debian"),
        "{text}"
    );
    nothing_used("a failed build");

    mode("hang");
    let e = db.ensure(&state, &trixie).unwrap_err();
    assert!(matches!(e, DebootstrapError::TimedOut { .. }), "{e}");
    nothing_used("a stopped build");
    assert!(
        eventually(5, || sandbox::testing::pids_with_cmdline_prefix(&token)
            .is_empty()),
        "a process of the stopped build is still running"
    );

    // What a killed build left is removed, never used; so is a published directory that
    // lost its digest.
    std::fs::create_dir_all(dir.join(format!("{name}.partial/rootfs/etc"))).unwrap();
    std::fs::write(
        dir.join(format!("{name}.partial/digest")),
        "sha256-forged\n",
    )
    .unwrap();
    std::fs::create_dir_all(dir.join(format!("{name}/rootfs/etc"))).unwrap();
    assert!(sandbox::debootstrap::cached(&state, &trixie)
        .unwrap()
        .is_none());
    mode("ok");
    // Two builders at once: one makes it, the other waits and takes it.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| db.ensure(&state, &trixie));
        let b = s.spawn(|| db.ensure(&state, &trixie));
        (a.join().unwrap().unwrap(), b.join().unwrap().unwrap())
    });
    assert_eq!(a.digest, b.digest);
    assert_eq!(
        std::fs::read_to_string(t.path().join("runs")).unwrap(),
        "run\n",
        "made once"
    );
    let built = a;
    assert!(!dir.join(format!("{name}.partial")).exists());
    assert!(built.digest.starts_with("sha256-") && built.digest != "sha256-forged");
    let root = &built.rootfs;
    assert_eq!(
        std::fs::read_to_string(root.join("etc/debian_version")).unwrap(),
        "13.99\n"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/resolv.conf")).unwrap(),
        ""
    );
    assert_eq!(
        std::fs::read_to_string(root.join("etc/apt/sources.list")).unwrap(),
        "deb http://mirror.invalid/debian trixie main\n",
        "a mirror of the user's own is kept"
    );
    let lists: Vec<_> = std::fs::read_dir(root.join("var/lib/apt/lists"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        lists,
        ["partial"],
        "package lists are left out, as in the images"
    );
    let again = db.ensure(&state, &trixie).unwrap();
    assert_eq!(again.digest, built.digest);
    assert_eq!(
        std::fs::read_to_string(t.path().join("runs")).unwrap(),
        "run\n"
    );

    // The runtime takes it by its spec from the same state directory, built already.
    let rt = Runtime::new(&state, init_program()).unwrap();
    let mut sb = rt
        .create(&minimal_config("debootstrap:trixie".parse().unwrap()))
        .unwrap();
    assert_eq!(sb.rootfs_digest(), built.digest);
    let r = sh(
        &mut sb,
        "cat /etc/debian_version; echo x > /etc/debian_version; cat /etc/debian_version",
    );
    assert_eq!(
        out(&r),
        "13.99\nx\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    drop(sb);
    drop(rt);
    assert_eq!(
        std::fs::read_to_string(root.join("etc/debian_version")).unwrap(),
        "13.99\n",
        "used in place, read-only"
    );
}

/// A loopback mirror for the hack trial below: `Release` without a signature, and a forged
/// `Release.gpg` when `forged` is set; stopped when dropped (by a panic too).
struct FakeMirror {
    port: u16,
    forged: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeMirror {
    fn start() -> Self {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let forged = std::sync::Arc::new(AtomicBool::new(false));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (f, s) = (forged.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let Ok((mut c, _)) = listener.accept() else {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                };
                c.set_nonblocking(false).unwrap();
                let mut head = [0u8; 4096];
                let n = c.read(&mut head).unwrap_or(0);
                let line = String::from_utf8_lossy(&head[..n]);
                let path = line.split_whitespace().nth(1).unwrap_or("");
                let body: Option<&str> = if path.ends_with("/dists/trixie/Release") {
                    Some("Origin: Debian\nSuite: stable\nCodename: trixie\nArchitectures: amd64\nComponents: main\nSHA256:\n")
                } else if path.ends_with("/dists/trixie/Release.gpg") && f.load(Ordering::Relaxed) {
                    Some("-----BEGIN PGP SIGNATURE-----\n\niQIzBAABCgAdFiEEforgedforgedforged\n=abcd\n-----END PGP SIGNATURE-----\n")
                } else {
                    None
                };
                let reply = match body {
                    Some(b) => format!(
                        "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{b}",
                        b.len()
                    ),
                    None => {
                        "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .into()
                    }
                };
                let _ = c.write_all(reply.as_bytes());
            }
        });
        Self {
            port,
            forged,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for FakeMirror {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Hack trial: a mirror (or anyone between it and us) that serves an index without a valid
/// signature gets nothing installed: an unsigned `Release`, one with a forged signature, and
/// an unsigned one on a machine without Debian's keyring (hidden in the build's own mount
/// namespace; without `--force-check-gpg` debootstrap would go on unchecked) all fail the
/// build, and nothing of it is used.
#[test]
fn a_mirror_serving_unsigned_or_forged_indexes_gets_nothing_installed() {
    use sandbox::debootstrap::{arch, Debootstrap, DebootstrapError, Suite};
    require_root!();
    let mut db = Debootstrap::from_env()
        .unwrap_or_else(|e| panic!("this test runs the real debootstrap: {e}"));
    let mirror = FakeMirror::start();
    let t = tempfile::tempdir().unwrap();
    let no_keyring = t.path().join("debootstrap-without-keyring");
    std::fs::write(
        &no_keyring,
        format!(
            "#!/bin/sh\nmount -t tmpfs none /usr/share/keyrings && exec {} \"$@\"\n",
            db.program.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &no_keyring,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let state = t.path().join("state");
    let real = db.program.clone();
    db.mirror = format!("http://127.0.0.1:{}/debian", mirror.port);
    db.timeout = std::time::Duration::from_secs(120);
    let trixie = Suite::parse("trixie").unwrap();
    let name = format!("trixie-{}", arch().unwrap());
    for (program, forge, expect) in [
        (&real, false, "Failed getting release signature file"),
        (
            &real,
            true,
            "Error executing gpgv to check Release signature",
        ),
        (
            &no_keyring,
            false,
            "Keyring-based check was requested; aborting",
        ),
    ] {
        db.program = program.clone();
        mirror
            .forged
            .store(forge, std::sync::atomic::Ordering::Relaxed);
        let e = db.ensure(&state, &trixie).unwrap_err();
        assert!(
            matches!(e, DebootstrapError::Failed { .. }) && e.to_string().contains(expect),
            "{} forged {forge}: {e}",
            program.display()
        );
        assert!(sandbox::debootstrap::cached(&state, &trixie)
            .unwrap()
            .is_none());
        assert!(!state.join(format!("debootstrap/{name}.partial")).exists());
        assert!(!state.join(format!("debootstrap/{name}")).exists());
    }
    assert!(
        std::path::Path::new("/usr/share/keyrings/debian-archive-keyring.gpg").is_file(),
        "the host's keyring was hidden only inside the build"
    );
}
