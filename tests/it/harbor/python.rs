//! The verifier's Python start-up file (`harbor::SAFE_PATH_SITECUSTOMIZE`) on this host's
//! Pythons, without a sandbox.

use engine::harbor;
use std::path::{Path, PathBuf};

/// The Pythons older than 3.11 on this host (they ignore `PYTHONSAFEPATH`).
fn old_pythons() -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = ["/root/.pyenv/versions", "/usr/local/lib/pyenv/versions"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            let minor = n
                .strip_prefix("3.")
                .and_then(|r| r.split('.').next()?.parse().ok());
            minor.is_some_and(|m: u32| (6..11).contains(&m))
        })
        .map(|e| e.path().join("bin/python3"))
        .chain((6..11).map(|m| PathBuf::from(format!("/usr/bin/python3.{m}"))))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
}

/// A folder with the verifier's `sitecustomize.py` in `site/` and an empty `app/`: (the
/// folder, site, app).
fn ours() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (site, app) = (t.path().join("site"), t.path().join("app"));
    std::fs::create_dir_all(&site).unwrap();
    std::fs::create_dir_all(&app).unwrap();
    let ours = harbor::SAFE_PATH_SITECUSTOMIZE;
    std::fs::write(site.join("sitecustomize.py"), ours).unwrap();
    (t, site, app)
}

/// The verifier's `sitecustomize.py` keeps the working directory off `sys.path` for
/// `python3 -m`: on a Python older than 3.11 where this host has one (`PYTHONSAFEPATH=1` set
/// and ignored: the planted module runs without ours), else on this host's `python3` with
/// `PYTHONSAFEPATH` unset. Without ours, the planted module runs (the test can fail).
#[test]
fn the_verifiers_sitecustomize_keeps_the_working_directory_off_sys_path() {
    let (_t, site, wd) = ours();
    std::fs::write(wd.join("json.py"), "print('PLANTED')\n").unwrap();
    let old = old_pythons();
    let pythons: Vec<(PathBuf, bool)> = if old.is_empty() {
        vec![("python3".into(), false)]
    } else {
        old.into_iter().map(|p| (p, true)).collect()
    };
    for (python, is_old) in &pythons {
        let run = |pythonpath: Option<&Path>| {
            let mut c = std::process::Command::new(python);
            c.args(["-m", "json.tool", "--help"])
                .current_dir(&wd)
                .env_remove("PYTHONPATH");
            if *is_old {
                c.env("PYTHONSAFEPATH", "1");
            } else {
                c.env_remove("PYTHONSAFEPATH");
            }
            if let Some(p) = pythonpath {
                c.env("PYTHONPATH", p);
            }
            let o = c.output().unwrap();
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        };
        if std::process::Command::new(python)
            .arg("-V")
            .output()
            .is_err()
        {
            eprintln!("skipped: no python3 on this host");
            return;
        }
        eprintln!("python: {}", python.display());
        let without = run(None);
        assert!(
            without.contains("PLANTED"),
            "{}: {without}",
            python.display()
        );
        let with = run(Some(&site));
        assert!(!with.contains("PLANTED"), "{}: {with}", python.display());
        assert!(with.contains("usage"), "{}: {with}", python.display());
        // Without a sitecustomize of the image's own (pyenv, python:3.x images, venvs): no
        // error at every Python start.
        assert!(
            !with.contains("Error in sitecustomize"),
            "{}: {with}",
            python.display()
        );
    }
}

/// A copy of `python`'s own `encodings` package in `app` whose `__init__.py` also writes
/// "PLANTED encodings" (to fd 2: no `sys.stderr` yet when Python imports it).
fn plant_encodings(python: &Path, app: &Path) -> Option<()> {
    let o = std::process::Command::new(python)
        .args(["-I", "-c", "import encodings; print(encodings.__path__[0])"])
        .output()
        .ok()?;
    let real = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
    let planted = app.join("encodings");
    let _ = std::fs::remove_dir_all(&planted);
    std::fs::create_dir_all(&planted).unwrap();
    for e in std::fs::read_dir(&real).ok()?.flatten() {
        if e.file_name().to_string_lossy().ends_with(".py") {
            std::fs::copy(e.path(), planted.join(e.file_name())).unwrap();
        }
    }
    let init = planted.join("__init__.py");
    let mut body = std::fs::read_to_string(&init).ok()?;
    body.push_str("\nimport posix as _p\n_p.write(2, b'PLANTED encodings\\n')\n");
    std::fs::write(init, body).unwrap();
    Some(())
}

/// Hack trial: the image's `PYTHONPATH` names a directory the agent writes (`/app`): a
/// `json.py` planted there never shadows the standard library's (nor a `pytest.py`
/// site-packages' pytest), a `sitecustomize.py` there never runs, nor an `encodings/`
/// package (imported before any sitecustomize) nor, on Pythons older than 3.11, a `site.py`;
/// the agent's own modules there still import. Without ours (the image's `PYTHONPATH` as
/// is), all planted ones run (the test can fail).
#[test]
fn modules_the_agent_plants_on_the_images_pythonpath_never_run() {
    let (t, site, app) = ours();
    std::fs::write(app.join("json.py"), "print('PLANTED json')\n").unwrap();
    std::fs::write(
        app.join("sitecustomize.py"),
        "print('PLANTED sitecustomize')\n",
    )
    .unwrap();
    std::fs::write(app.join("solution.py"), "ANSWER = 42\n").unwrap();
    let old = old_pythons();
    let mut pythons: Vec<(PathBuf, bool)> = old.into_iter().map(|p| (p, true)).collect();
    pythons.push(("python3".into(), false));
    for (python, is_old) in &pythons {
        let run = |pythonpath: String, image: Option<String>| {
            let mut c = std::process::Command::new(python);
            c.args([
                "-c",
                "import json, solution; print('answer', solution.ANSWER)",
            ])
            .current_dir(t.path())
            .env("PYTHONPATH", pythonpath)
            .env("PYTHONSAFEPATH", "1")
            .env_remove(harbor::IMAGE_PYTHONPATH);
            if let Some(image) = image {
                c.env(harbor::IMAGE_PYTHONPATH, image);
            }
            let o = c.output().ok()?;
            Some(format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ))
        };
        if plant_encodings(python, &app).is_none() {
            eprintln!("skipped: no {}", python.display());
            continue;
        }
        let site_py = app.join("site.py");
        let _ = std::fs::remove_file(&site_py);
        if *is_old {
            let planted = "import posix as _p\n_p.write(2, b'PLANTED site.py\\n')\n";
            std::fs::write(&site_py, planted).unwrap();
        }
        let Some(without) = run(app.display().to_string(), None) else {
            eprintln!("skipped: no {}", python.display());
            continue;
        };
        eprintln!("python: {}", python.display());
        let mut planted = vec!["PLANTED json", "PLANTED encodings"];
        // A planted site.py replaces the site module that imports sitecustomize.
        planted.push(if *is_old {
            "PLANTED site.py"
        } else {
            "PLANTED sitecustomize"
        });
        for p in planted {
            assert!(without.contains(p), "{}: {p}: {without}", python.display());
        }
        let with = run(site.display().to_string(), Some(app.display().to_string())).unwrap();
        assert!(!with.contains("PLANTED"), "{}: {with}", python.display());
        assert!(with.contains("answer 42"), "{}: {with}", python.display());
        assert!(!with.contains("Error"), "{}: {with}", python.display());
    }
}
