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

/// Plants a distribution declaring a `pytest11` plugin `name` (module `name`, `body`) in `dir`.
fn plant_plugin(dir: &Path, name: &str, body: &str) {
    let info = dir.join(format!("{name}-1.0.dist-info"));
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(dir.join(format!("{name}.py")), body).unwrap();
    let meta = format!("Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n");
    std::fs::write(info.join("METADATA"), meta).unwrap();
    let eps = format!("[pytest11]\n{name} = {name}\n");
    std::fs::write(info.join("entry_points.txt"), eps).unwrap();
}

/// A virtual environment of `python` in `dir` (the system's site-packages seen too, no pip)
/// and its site-packages: (its python, its site-packages).
fn venv(python: &Path, dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let ok = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip", "--system-site-packages"])
        .arg(dir)
        .output()
        .ok()?
        .status
        .success();
    if !ok {
        return None;
    }
    let py = dir.join("bin/python");
    let o = std::process::Command::new(&py)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .ok()?;
    Some((py, PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())))
}

/// Hack trial: the image's `PYTHONPATH` names a directory the agent writes (`/app`), and
/// the interpreter is a virtual environment with an editable install whose `.pth` names
/// another (`/app/src`). The agent leaves there distributions declaring a `pytest11` plugin
/// that turns every test report into a pass (pytest loads such plugins by itself) and an
/// entry point of another group (libraries load their own groups by themselves), an
/// `msvcrt.py` (which the standard library tries, and misses, on Linux at every pytest
/// start) that loads the plugin, and in the editable install's directory a `_scproxy.py`
/// (another standard-library name this Python lacks). With the verifier's
/// `sitecustomize.py`: none of the agent's entry points is seen, neither module is found
/// (`importlib.util.find_spec` says None), a failing test fails, a plugin of the
/// interpreter's own site-packages still loads and the agent's own module still imports.
/// Without ours, the failing test passes (the test can fail). The entry points and modules
/// on every host Python 3.8 and later; pytest on the system's `python3` where it has pytest
/// (Debian's python3-pytest in CI); and on every host Python with `pkg_resources`, an agent
/// `namespace_packages.txt` naming `encodings` never makes a codec lookup run the agent's
/// `encodings/agentcodec.py`.
#[test]
fn code_the_agent_leaves_on_the_images_pythonpath_never_runs_in_pytest() {
    let (t, site, app) = ours();
    plant_plugin(&app, "agentplug", super::PASS_ALL);
    let groups = "[pytest11]\nagentplug = agentplug\n[agent.hooks]\nhook = agentplug\n";
    std::fs::write(app.join("agentplug-1.0.dist-info/entry_points.txt"), groups).unwrap();
    let planted = "import os\nos.environ['PYTEST_PLUGINS'] = 'agentplug'\nprint('PLANTED msvcrt')\nraise ModuleNotFoundError('msvcrt')\n";
    std::fs::write(app.join("msvcrt.py"), planted).unwrap();
    std::fs::write(app.join("solution.py"), "ANSWER = 42\n").unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    plant_plugin(&src, "srcplug", super::PASS_ALL);
    std::fs::write(src.join("_scproxy.py"), "print('PLANTED _scproxy')\n").unwrap();
    let image = "def pytest_configure(config):\n    print('IMAGE PLUGIN LOADED')\n";
    let tests = t.path().join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    let test = "from solution import ANSWER\ndef test_done():\n    assert ANSWER == 41\n";
    std::fs::write(tests.join("test_x.py"), test).unwrap();
    // `python ARGS` with the agent's directory `agent` on the image's PYTHONPATH, through
    // ours or (without) as a plain PYTHONPATH: (exit code, output).
    let run_on = |python: &Path, with_ours: bool, agent: &Path, args: &[&str]| {
        let mut c = std::process::Command::new(python);
        c.args(args)
            .current_dir(t.path())
            .env("PYTHONSAFEPATH", "1")
            .env("PYTHONNOUSERSITE", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTEST_ADDOPTS")
            .env_remove("PYTEST_PLUGINS")
            .env_remove("PYTEST_DISABLE_PLUGIN_AUTOLOAD");
        if with_ours {
            c.env("PYTHONPATH", &site)
                .env(harbor::IMAGE_PYTHONPATH, agent);
        } else {
            c.env("PYTHONPATH", agent)
                .env_remove(harbor::IMAGE_PYTHONPATH);
        }
        let o = c.output().unwrap();
        (
            o.status.code(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
        )
    };
    let run = |python: &Path, with_ours: bool, args: &[&str]| run_on(python, with_ours, &app, args);
    // Each Python's virtual environment, with the image's plugin and the editable .pth.
    let mut pythons: Vec<PathBuf> = ["/root/.pyenv/versions", "/usr/local/lib/pyenv/versions"]
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/python3"))
        .chain(std::iter::once(PathBuf::from("/usr/bin/python3")))
        .filter(|p| p.is_file())
        .collect();
    pythons.sort();
    let query = "import sys\ntry:\n    import importlib.metadata as md\nexcept ImportError:\n    print('none'); sys.exit(0)\nnames = sorted(set(e.name for d in md.distributions() for e in d.entry_points if 'plug' in e.name or e.group == 'agent.hooks'))\ntry:\n    import msvcrt\n    found = 'msvcrt found'\nexcept ImportError:\n    found = 'no msvcrt'\ntry:\n    import _scproxy\n    found += ', _scproxy found'\nexcept ImportError:\n    found += ', no _scproxy'\nimport importlib.util, solution\nprint(names, found, importlib.util.find_spec('msvcrt'), solution.ANSWER)\n";
    let mut checked = 0;
    for (i, python) in pythons.iter().enumerate() {
        let Some((py, own)) = venv(python, &t.path().join(format!("venv{i}"))) else {
            eprintln!("skipped: no venv of {}", python.display());
            continue;
        };
        plant_plugin(&own, "imageplug", image);
        let pth = format!("{}\n", src.display());
        std::fs::write(own.join("__editable__.agent-0.1.pth"), pth).unwrap();
        let (_, without) = run(&py, false, &["-c", query]);
        if without.trim() == "none" {
            eprintln!("{}: no importlib.metadata", python.display());
            continue;
        }
        eprintln!("python: {}", python.display());
        let all = "['agentplug', 'hook', 'imageplug', 'srcplug'] no msvcrt, _scproxy found";
        assert!(without.contains(all), "{}: {without}", python.display());
        assert!(
            without.contains("PLANTED msvcrt"),
            "{}: {without}",
            python.display()
        );
        let (_, with) = run(&py, true, &["-c", query]);
        let only = "['imageplug'] no msvcrt, no _scproxy None 42";
        assert!(with.contains(only), "{}: {with}", python.display());
        assert!(!with.contains("PLANTED"), "{}: {with}", python.display());
        checked += 1;
        // pytest itself, where the system's python3 has it.
        let has_pytest = run(&py, false, &["-c", "import pytest"]).0 == Some(0);
        if python != Path::new("/usr/bin/python3") {
            continue;
        }
        if !has_pytest {
            eprintln!("skipped the pytest run: the system's python3 has no pytest");
            continue;
        }
        let args = ["-m", "pytest", "-p", "no:cacheprovider", "tests/test_x.py"];
        let (code, without) = run(&py, false, &args);
        assert_eq!(code, Some(0), "without ours: {without}");
        assert!(without.contains("1 passed"), "{without}");
        let (code, with) = run(&py, true, &args);
        assert_eq!(code, Some(1), "with ours: {with}");
        assert!(with.contains("1 failed"), "{with}");
        assert!(with.contains("IMAGE PLUGIN LOADED"), "{with}");
        assert!(!with.contains("PLANTED"), "{with}");
        assert!(!with.contains("Error in sitecustomize"), "{with}");
        assert!(!with.contains("INTERNALERROR"), "{with}");
        // The plugin alone, and the msvcrt trick alone, each pass the test without ours.
        std::fs::remove_file(app.join("msvcrt.py")).unwrap();
        let (code, alone) = run(&py, false, &args);
        assert_eq!(code, Some(0), "the plugin alone: {alone}");
        std::fs::write(app.join("msvcrt.py"), planted).unwrap();
        std::fs::remove_dir_all(app.join("agentplug-1.0.dist-info")).unwrap();
        std::fs::remove_file(own.join("__editable__.agent-0.1.pth")).unwrap();
        let (code, alone) = run(&py, false, &args);
        assert_eq!(code, Some(0), "msvcrt alone: {alone}");
        let (code, with) = run(&py, true, &args);
        assert_eq!(code, Some(1), "msvcrt alone, with ours: {with}");
        plant_plugin(&app, "agentplug", super::PASS_ALL);
    }
    assert!(checked > 0, "no host Python with importlib.metadata");
    // A namespace declaration (`namespace_packages.txt`) that `pkg_resources` honours as it
    // is imported adds the agent's `encodings/` to the standard library's
    // `encodings.__path__`: a codec looked up after is not found there.
    let ns = t.path().join("nsapp");
    let info = ns.join("agentns-1.0.egg-info");
    std::fs::create_dir_all(&info).unwrap();
    std::fs::create_dir_all(ns.join("encodings")).unwrap();
    let pkg = "Metadata-Version: 1.0\nName: agentns\nVersion: 1.0\n";
    std::fs::write(info.join("PKG-INFO"), pkg).unwrap();
    std::fs::write(info.join("namespace_packages.txt"), "encodings\n").unwrap();
    std::fs::write(ns.join("encodings/__init__.py"), "").unwrap();
    let codec = "print('PLANTED codec')\ndef getregentry():\n    return None\n";
    std::fs::write(ns.join("encodings/agentcodec.py"), codec).unwrap();
    let lookup = "import pkg_resources\ntry:\n    'a'.encode('agentcodec')\nexcept LookupError:\n    pass\nprint('looked up')\n";
    let mut with_pkg_resources = 0;
    for python in &pythons {
        let (_, out) = run_on(python, true, &ns, &["-c", lookup]);
        if out.contains("No module named 'pkg_resources'") {
            continue;
        }
        assert!(out.contains("looked up"), "{}: {out}", python.display());
        assert!(!out.contains("PLANTED"), "{}: {out}", python.display());
        with_pkg_resources += 1;
    }
    eprintln!("pkg_resources' namespaces checked on {with_pkg_resources} Pythons");
}
