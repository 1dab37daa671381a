#![allow(clippy::unwrap_used)]
//! End-to-end tests of the `engine` command line (run as root, like CI).

use std::process::Command;

fn engine() -> Command {
    Command::new(env!("CARGO_BIN_EXE_engine"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn sandbox_exec_prints_output_and_exits_with_the_command_status() {
    if !is_root() {
        return;
    }
    let o = engine()
        .args([
            "sandbox",
            "exec",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(7));
    assert_eq!(o.stdout, b"out\n");
    assert_eq!(String::from_utf8_lossy(&o.stderr), "err\n");
}

#[test]
fn sandbox_exec_documented_exit_codes() {
    if !is_root() {
        return;
    }
    let o = engine()
        .args(["sandbox", "exec", "--timeout", "300ms", "--", "sleep", "10"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&o.stderr).contains("timed out"));
    let o = engine()
        .args(["sandbox", "exec", "--", "no-such-tool"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&o.stderr).contains("cannot run \"no-such-tool\""));
    let o = engine()
        .args([
            "sandbox",
            "exec",
            "--memory",
            "32M",
            "--",
            "perl",
            "-e",
            "$x = q(a) x (256 * 1024 * 1024)",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(137));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("out of memory"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = engine()
        .args([
            "sandbox",
            "exec",
            "--disk",
            "1M",
            "--",
            "sh",
            "-c",
            "head -c 4M /dev/zero > /root/f",
        ])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("No space left on device"));
}

#[test]
fn bad_options_and_rootfs_get_clear_errors_and_leave_nothing() {
    if !is_root() {
        return;
    }
    let runs = std::path::Path::new("/var/lib/envfactory/runs");
    let o = engine()
        .args(["sandbox", "exec", "--rootfs", "nowhere:1", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown rootfs \"nowhere:1\""));
    let o = engine()
        .args(["sandbox", "exec", "--memory", "lots", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--memory: \"lots\" is not a size"));
    // The kernel refuses a limit (a CPU quota under its 1 ms minimum): the error names the
    // file, and the failed run leaves nothing behind.
    let o = engine()
        .args(["sandbox", "exec", "--cpus", "0.001", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("the kernel refused cpu") && err.contains("quota"),
        "{err}"
    );
    for e in std::fs::read_dir(runs).unwrap().flatten() {
        // A run of a concurrent test may finish (and vanish) while we look.
        let Ok(owner) = std::fs::read_to_string(e.path().join("owner")) else {
            continue;
        };
        assert!(
            sandbox::state::is_alive(&owner).is_some(),
            "leaked run {:?}",
            e.path()
        );
    }
}

#[test]
fn run_executes_an_experiment_and_writes_a_report() {
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("exp.toml");
    std::fs::write(
        &cfg,
        format!(
            "[experiment]\nname = \"smoke\"\nseeds = [1, 2]\nout_dir = \"{}\"\n[sandbox]\nworkers = 2\n\
             [episodes]\ncount = 4\nsteps = [\"echo {{seed}}-{{episode}} > /root/x\", \"test -s /root/x\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = engine()
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join("smoke/report.json")).unwrap())
            .unwrap();
    let seeds = report["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2);
    for s in seeds {
        assert_eq!(s["steps"], 8);
        assert_eq!(s["failed_steps"], 0);
        assert_eq!(s["infra_failures"], 0);
    }
    assert!(report["steps_per_s"]["mean"].as_f64().unwrap() > 0.0);

    // A broken config names the file, line and key.
    std::fs::write(&cfg, "[experiment]\nname = \"x\"\nseeds = [1]\nbogus = 1\n[episodes]\ncount = 1\nsteps = [\"true\"]\n").unwrap();
    let o = engine()
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("exp.toml:4:1: unknown field `bogus`"), "{err}");
}

#[test]
fn bench_sandbox_json_has_the_documented_keys() {
    if !is_root() {
        return;
    }
    let o = engine()
        .args(["bench", "sandbox", "--json", "--iterations", "3"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    for k in [
        "host_sh_true",
        "create_first_exec",
        "exec_sh_true",
        "reset_100_files",
        "snapshot_100_files",
        "rollback",
        "idle_rss_kib",
        "idle_pss_kib",
        "idle_private_kib",
    ] {
        let m = v[k]["median"].as_f64().unwrap_or(f64::NAN);
        assert!(m > 0.0, "{k}: {m}");
        assert!(v[k]["p90"].as_f64().unwrap() >= m, "{k}");
    }
    assert!(v["ratios"]["exec_vs_host"].as_f64().unwrap() > 0.0);
}
