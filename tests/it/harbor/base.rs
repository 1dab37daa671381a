//! How `FROM` is taken on the `host` base: a `python` image's pip installs as in that image.

use super::{copy_fixture, on_host, Store};
use crate::common;
use engine::harbor;

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
    // A wheel in the build context (installed with --no-index: no network needed).
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
        .arg(dir.join("environment/fakepkg-1.0-py3-none-any.whl"))
        .status()
        .unwrap();
    assert!(made.success());
    let build = |from: &str| {
        let text = format!(
            "FROM {from}\nCOPY fakepkg-1.0-py3-none-any.whl /tmp/\n\
             RUN python3 -m pip install --no-index /tmp/fakepkg-1.0-py3-none-any.whl \
             && python3 -c 'import fakepkg; assert fakepkg.VALUE == 42'\n"
        );
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
