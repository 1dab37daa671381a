//! How `FROM` is taken without a local image: a `python` image's pip on the `host` base
//! installs as in that image; `debian:SUITE` of another suite is that suite, made with
//! debootstrap from the Debian archive, and `python:3.X` the suite with that Python.

use super::{copy_fixture, on_host, Store};
use crate::common;
use engine::harbor::{self, Agent, BuildNetwork, BuildOptions};
use sandbox::debootstrap::{self, Suite};

/// A wheel of `fakepkg` (`VALUE = 42`) in a task's build context, installed by its steps with
/// `--no-index` (no network needed).
fn put_wheel(task: &std::path::Path) {
    let made = std::process::Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1], 'w')\n\
             z.writestr('fakepkg/__init__.py', 'VALUE = 42\\n')\n\
             d = 'fakepkg-1.0.dist-info/'\n\
             z.writestr(d + 'METADATA', 'Metadata-Version: 2.1\\nName: fakepkg\\nVersion: 1.0\\n')\n\
             z.writestr(d + 'WHEEL', 'Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n')\n\
             z.writestr(d + 'RECORD', '')\n",
        )
        .arg(task.join("environment/fakepkg-1.0-py3-none-any.whl"))
        .status()
        .unwrap();
    assert!(made.success());
}

/// What a step installs the wheel with, and checks it is there.
const PIP_INSTALL: &str = "python3 -m pip install --no-index /tmp/fakepkg-1.0-py3-none-any.whl \
     && python3 -c 'import fakepkg; assert fakepkg.VALUE == 42'";

/// `FROM python:*` on the `host` base: pip installs into `/usr/local` in build steps as it
/// does in that image (the host's Debian Python is externally managed, PEP 668), and only
/// there: `FROM debian:*` keeps Debian's refusal, as the real image would.
#[test]
fn a_python_base_on_the_host_lets_pip_install_as_that_image_does() {
    require_root!();
    let rt = common::runtime();
    let s = Store::new();
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    put_wheel(&dir);
    let build = |from: &str| {
        let text =
            format!("FROM {from}\nCOPY fakepkg-1.0-py3-none-any.whl /tmp/\nRUN {PIP_INSTALL}\n");
        let task = harbor::load(&dir).unwrap();
        std::fs::write(&task.dockerfile, &text).unwrap();
        let df = harbor::dockerfile::parse(&text).unwrap();
        harbor::build_image(&rt, &s.store, &task, &df, &on_host())
    };
    let img = build("python:3.11-slim").unwrap_or_else(|e| panic!("{e}"));
    assert!(
        img.base_note.contains("PIP_BREAK_SYSTEM_PACKAGES=1"),
        "{}",
        img.base_note
    );
    let installed = img.layers[0].join("usr/local/lib");
    let found = std::process::Command::new("find")
        .arg(&installed)
        .args(["-name", "__init__.py", "-path", "*fakepkg*"])
        .output()
        .unwrap();
    assert!(
        !found.stdout.is_empty(),
        "installed under /usr/local: {}",
        String::from_utf8_lossy(&found.stderr)
    );
    let e = build("debian:bookworm").unwrap_err().to_string();
    assert!(e.contains("line 3: the step failed"), "{e}");
}

/// `FROM debian:SUITE` of a suite other than this host's, with no local image: that suite's
/// minimal system made with debootstrap from the Debian archive (once per state directory:
/// this test's own, so every run makes it, about half a minute), its build steps and the
/// task's oracle and tests run on it. Offline, a suite made before is still taken; the host's
/// own suite stays the `host` base. `python:3.13-slim` is trixie with its Python (installed
/// from trixie's archive by a step before the file's), which an offline build cannot install.
#[test]
fn from_debian_of_another_suite_is_that_suite_made_with_debootstrap() {
    require_root!();
    let state = common::TempState::new();
    let rt = sandbox::Runtime::new(state.path(), common::init_program()).unwrap();
    let s = Store::new();
    let t = copy_fixture("harbor/hello-file");
    let dir = t.path().join("task");
    let dockerfile = dir.join("environment/Dockerfile");
    let original = std::fs::read_to_string(&dockerfile).unwrap();
    let set_from = |from: &str| {
        let text = original.replace("FROM debian:bookworm", &format!("FROM {from}"))
            + "RUN cat /etc/debian_version > /etc/built-on && ! command -v python3 \
               && chmod 644 /etc/ssl/certs/ca-certificates.crt \
               && sha256sum /etc/ssl/certs/ca-certificates.crt > /etc/build-ca\n";
        std::fs::write(&dockerfile, text).unwrap();
    };
    let try_check = |opts: &BuildOptions| {
        harbor::check_task(&rt, &rt, &s.store, &dir, opts, &Agent::Oracle, &[], 1)
    };
    let check = |opts: &BuildOptions| try_check(opts).unwrap_or_else(|e| panic!("{e}"));
    set_from("debian:trixie-slim");
    let o = check(&BuildOptions::default());
    assert!(
        o.base
            .starts_with("FROM debian:trixie-slim -> debootstrap:trixie (no local image"),
        "{}",
        o.base
    );
    assert!(o.passed, "the oracle and the tests on trixie: {o:?}");
    let trixie = Suite::parse("trixie").unwrap();
    let made = debootstrap::cached(rt.state_dir(), &trixie)
        .unwrap()
        .expect("trixie made once");
    let version = std::fs::read_to_string(made.rootfs.join("etc/debian_version")).unwrap();
    assert!(version.starts_with("13."), "{version}");
    // Made over HTTPS; its apt reads the images' own source.
    let sources = std::fs::read_to_string(made.rootfs.join("etc/apt/sources.list")).unwrap();
    assert_eq!(
        sources.trim(),
        "deb http://deb.debian.org/debian trixie main"
    );
    // The step ran on it: its layer holds trixie's version, and no python3 was there.
    let task = harbor::load(&dir).unwrap();
    let df = harbor::dockerfile::parse(&std::fs::read_to_string(&dockerfile).unwrap()).unwrap();
    let img = harbor::build_image(&rt, &s.store, &task, &df, &BuildOptions::default()).unwrap();
    assert_eq!(img.built, 0, "every layer cached");
    assert_eq!(
        std::fs::read_to_string(img.layers[0].join("etc/built-on")).unwrap(),
        version
    );
    // Its steps trusted what the host trusts for TLS, and the image does not keep the host's
    // bundle (the step's `chmod` copied it up) nor its layer's modes.
    let host_ca = std::process::Command::new("sha256sum")
        .arg("/etc/ssl/certs/ca-certificates.crt")
        .output()
        .unwrap();
    assert!(
        host_ca.status.success(),
        "the host's CA bundle (.ci/run installs ca-certificates)"
    );
    assert_eq!(
        std::fs::read(img.layers[0].join("etc/build-ca")).unwrap(),
        host_ca.stdout
    );
    assert!(!img.layers[0]
        .join("etc/ssl/certs/ca-certificates.crt")
        .exists());
    {
        use std::os::unix::fs::PermissionsExt;
        let etc = std::fs::metadata(img.layers[0].join("etc")).unwrap();
        assert_eq!(etc.permissions().mode() & 0o7777, 0o755);
    }
    // (Not the suite's own: made over HTTPS, trixie has a bundle without the host's additions.)
    let own = std::fs::read(made.rootfs.join("etc/ssl/certs/ca-certificates.crt")).ok();
    assert_ne!(
        own,
        std::fs::read("/etc/ssl/certs/ca-certificates.crt").ok()
    );
    // Offline: the suite made before is taken (not made again).
    let digest_file = made.rootfs.parent().unwrap().join("digest");
    let when = std::fs::metadata(&digest_file).unwrap().modified().unwrap();
    let offline = BuildOptions {
        network: BuildNetwork::Offline,
        ..BuildOptions::default()
    };
    let o = check(&offline);
    assert!(o.base.contains("-> debootstrap:trixie"), "{}", o.base);
    assert!(o.passed, "{o:?}");
    assert_eq!(
        std::fs::metadata(&digest_file).unwrap().modified().unwrap(),
        when
    );
    // `FROM python:3.13-slim` is trixie too, with its python3, pip, venv, `python` and pytest
    // from trixie's archive (a step of its own, before the file's), pip installing as in that
    // image, from a wheel and from PyPI (through the build network, trusting the host's CAs).
    put_wheel(&dir);
    let python_file = original.replace("FROM debian:bookworm", "FROM python:3.13-slim")
        + &format!(
            "COPY fakepkg-1.0-py3-none-any.whl /tmp/\nRUN {PIP_INSTALL} \
             && python --version > /etc/python-version && python3 -m venv /tmp/venv \
             && python3 -m pytest --version && pip install six==1.16.0 \
             && python3 -c 'import six'\n"
        );
    std::fs::write(&dockerfile, &python_file).unwrap();
    let o = check(&BuildOptions::default());
    assert!(
        o.base
            .starts_with("FROM python:3.13-slim -> debootstrap:trixie (no local image")
            && o.base
                .contains("with its python3, pip, venv and pytest (Python 3.13 as asked)")
            && o.base.contains("PIP_BREAK_SYSTEM_PACKAGES=1"),
        "{}",
        o.base
    );
    assert!(
        o.passed,
        "the oracle and the tests on trixie's Python: {o:?}"
    );
    let task = harbor::load(&dir).unwrap();
    let df = harbor::dockerfile::parse(&python_file).unwrap();
    let img = harbor::build_image(&rt, &s.store, &task, &df, &BuildOptions::default()).unwrap();
    assert_eq!(img.built, 0, "every layer cached");
    let python = std::fs::read_to_string(img.layers[0].join("etc/python-version")).unwrap();
    assert!(python.starts_with("Python 3.13."), "{python}");
    // `--base debootstrap:trixie` gets the same step (the same layers); offline it cannot,
    // and says so at the `FROM` line.
    let on_trixie = |network| BuildOptions {
        base: Some(sandbox::RootfsSpec::Debootstrap(trixie.clone())),
        network,
    };
    let img = harbor::build_image(
        &rt,
        &s.store,
        &task,
        &df,
        &on_trixie(BuildNetwork::default()),
    )
    .unwrap();
    assert_eq!(img.built, 0, "every layer cached");
    assert!(
        img.base_note
            .contains("(--base); with its python3, pip, venv and pytest (Python 3.13 as asked)"),
        "{}",
        img.base_note
    );
    let e = harbor::build_image(&rt, &s.store, &task, &df, &on_trixie(BuildNetwork::Offline))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 1: FROM python:3.13-slim: an offline build cannot install Debian trixie's python3"),
        "{e}"
    );
    // Offline, trixie's Python cannot be installed: the host (as before there was any).
    let (spec, note) = harbor::build::resolve_from(&rt, &task, &df, &offline).unwrap();
    assert_eq!(spec, sandbox::RootfsSpec::Host);
    assert!(
        note.contains(
            "-> host (no local image, and an offline build cannot install Debian trixie's python3"
        ),
        "{note}"
    );
    // The host's own suite is the host (which has python3: the step fails there), when no
    // local image of that name is there: the Docker tests of this binary import
    // `debian:bookworm` into the daemon of the process's `DOCKER_HOST`.
    let host = debootstrap::host_suite().filter(|h| {
        let image = sandbox::RootfsSpec::Docker(format!("debian:{h}"));
        let local = rt.resolve(&image).is_ok();
        if local {
            eprintln!("skipped the host's own suite: a local image debian:{h} is there");
        }
        !local
    });
    if let Some(host) = host {
        set_from(&format!("debian:{host}"));
        let e = try_check(&BuildOptions::default()).unwrap_err().to_string();
        assert!(e.contains("line 11: the step failed"), "{e}");
        let task = harbor::load(&dir).unwrap();
        let df = harbor::dockerfile::parse(&std::fs::read_to_string(&dockerfile).unwrap()).unwrap();
        let (spec, note) =
            harbor::build::resolve_from(&rt, &task, &df, &BuildOptions::default()).unwrap();
        assert_eq!(spec, sandbox::RootfsSpec::Host);
        assert!(
            note.contains("-> host (this host's own Debian suite"),
            "{note}"
        );
    }
}
