//! End-to-end tests of the `engine` command line (run as root, like CI).

use crate::common;

use common::{is_root, TempState as State};
use std::process::Command;

fn engine() -> Command {
    Command::new(env!("CARGO_BIN_EXE_engine"))
}

/// `engine` over a private state directory: its instance cache (a tmpfs) is unmounted when
/// `st` drops, so no test leaves a mount behind.
fn engine_in(st: &State) -> Command {
    let mut c = engine();
    c.env("ENVFACTORY_STATE", st.path());
    c
}

/// A one-shot's forked init makes its own network namespace as its first step (its clone
/// leaves `CLONE_NEWNET` out, `spawn_init::fork_init`): the command sees only its own `lo`,
/// up, and cannot reach a listener on the host's loopback.
#[test]
fn a_one_shots_network_is_its_own_loopback_only() {
    if !is_root() {
        return;
    }
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let script = format!(
        "ls /sys/class/net; cat /sys/class/net/lo/flags; \
         (echo x > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo REACHED || echo refused"
    );
    let o = engine()
        .args(["sandbox", "exec", "--", "bash", "-c", &script])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let lines: Vec<&str> = out.lines().collect();
    let [interfaces, flags, reached] = lines[..] else {
        panic!("one interface, its flags and the connection's outcome: {out}");
    };
    assert_eq!(interfaces, "lo", "only lo: {out}");
    let flags = u32::from_str_radix(flags.trim_start_matches("0x"), 16).unwrap();
    assert_eq!(flags & 1, 1, "lo is up: {out}");
    assert_eq!(reached, "refused", "the host's loopback: {out}");
    host.set_nonblocking(true).unwrap();
    assert!(
        host.accept().is_err(),
        "nothing connected to the host listener"
    );
}

/// Every `engine` process starts with one library less: `sandbox/build.rs` links the C
/// toolchain's unwinder in (`libgcc_eh.a`) where the toolchain has it, so neither the engine
/// nor this test binary (both link the sandbox crate) loads `libgcc_s.so.1`, and panics
/// still unwind and are caught.
#[test]
fn the_engine_links_its_unwinder_in_and_panics_still_unwind() {
    let archive = Command::new("cc")
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !std::path::Path::new(&archive).is_absolute()
        || std::env::var_os("ENVFACTORY_DYNAMIC_LIBGCC").is_some()
    {
        eprintln!(
            "skipped: the toolchain has no libgcc_eh.a (or ENVFACTORY_DYNAMIC_LIBGCC is set)"
        );
        return;
    }
    // The dynamic section's NEEDED entries, as readelf (binutils, beside the linker) reads it:
    // the front's and the engine program's.
    for bin in [
        env!("CARGO_BIN_EXE_engine"),
        env!("CARGO_BIN_EXE_engine-core"),
    ] {
        let d = Command::new("readelf")
            .args(["-d", bin])
            .output()
            .expect("readelf (binutils) runs");
        let dynamic = String::from_utf8_lossy(&d.stdout);
        let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
        assert!(
            d.status.success() && needed.iter().any(|l| l.contains("libc.so")),
            "{bin}: {dynamic}"
        );
        assert!(
            !needed.iter().any(|l| l.contains("libgcc_s")),
            "{bin} needs libgcc_s: {needed:?}"
        );
    }
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    assert!(!maps.contains("libgcc_s"), "loaded here: {maps}");
    let caught = std::panic::catch_unwind(|| panic!("unwinds through the linked-in unwinder"));
    assert!(caught.is_err());
    let o = engine().arg("--version").output().unwrap();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stdout).starts_with("engine "));
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

/// Signals ignored where the engine is started (`nohup`, a background job, a supervisor) do
/// not reach the sandbox: init starts with every disposition at its default
/// (`sandbox/src/spawn_init.rs`), so a command can be stopped by SIGUSR2 or SIGQUIT as usual.
#[test]
fn signals_ignored_by_whoever_starts_the_engine_are_not_ignored_in_the_sandbox() {
    if !is_root() {
        return;
    }
    use std::os::unix::process::CommandExt;
    let mut c = engine();
    c.args([
        "sandbox",
        "exec",
        "--",
        "grep",
        "-E",
        "^Sig(Blk|Ign)",
        "/proc/self/status",
    ]);
    // SAFETY: signal(2) is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        c.pre_exec(|| {
            for sig in [libc::SIGUSR2, libc::SIGQUIT, libc::SIGPIPE] {
                libc::signal(sig, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{o:?}");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n",
        "{o:?}"
    );
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
    assert_eq!(o.status.code(), Some(2), "bad input exits 2");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--rootfs: unknown rootfs `nowhere:1`"));
    let o = engine()
        .args(["sandbox", "exec", "--memory", "lots", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--memory: `lots` is not a size"));
    // Values past the limits are errors, not panics (exit 101) nor wrapped limits.
    for (opt, v, said) in [
        ("--timeout", "99999999999999999999s", "is out of range"),
        ("--disk", "18446744073709551615", "is out of range"),
        ("--pids", "18446744073709551615", "is outside 2..=4194304"),
        ("--cpus", "inf", "is not a number of cores"),
        ("--cpus", "NaN", "is not a number of cores"),
    ] {
        let o = engine()
            .args(["sandbox", "exec", opt, v, "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{opt} {v}: {err}");
        assert!(
            err.starts_with(&format!("engine: {opt}: ")) && err.contains(said),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
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
    let st = State::new();
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("exp.toml");
    let read_json = |p: &std::path::Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let episodes = |name: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(dir.path().join(name).join("episodes.jsonl")).unwrap();
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };

    // The oracle on the unperturbed task solves every episode.
    std::fs::write(
        &cfg,
        format!(
            "[experiment]\nname = \"oracle\"\nseeds = [1, 2]\nout_dir = \"{}\"\n\
             [environment]\ntask = \"archive-logs\"\nepisodes = 3\nworkers = 2\nagent = \"oracle\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = engine_in(&st)
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("seed")).count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("(mean ± 95% CI over 2 seeds)"), "{stdout}");
    let report = read_json(&dir.path().join("oracle/report.json"));
    for key in [
        "name",
        "task",
        "agent",
        "workers",
        "episodes_per_seed",
        "require_certified",
        "reward",
        "seeds",
        "steps_per_s",
        "success_rate",
        "mean_return",
        "reset_ms",
        "episodes_file",
    ] {
        assert!(report.get(key).is_some(), "report lacks {key}: {report}");
    }
    assert_eq!(report["task"], "archive-logs");
    let seeds = report["seeds"].as_array().unwrap();
    assert_eq!(seeds.len(), 2);
    for s in seeds {
        for key in [
            "episodes",
            "skipped_uncertified",
            "infra_failures",
            "steps",
            "steps_per_s",
            "success_rate",
            "mean_return",
            "reset_ms_median",
        ] {
            assert!(s.get(key).is_some(), "seed lacks {key}: {s}");
        }
        assert_eq!(s["episodes"], 3);
        assert_eq!(s["skipped_uncertified"], 0);
        assert_eq!(s["infra_failures"], 0);
        assert_eq!(s["success_rate"], 1.0, "{s}");
        assert!(s["steps"].as_u64().unwrap() >= 3);
        // Each success earns the goal bonus: the mean return is positive.
        assert!(s["mean_return"].as_f64().unwrap() > 0.0, "{s}");
        assert!(s["reset_ms_median"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(report["success_rate"]["mean"], 1.0);
    assert!(report["steps_per_s"]["mean"].as_f64().unwrap() > 0.0);
    let eps = episodes("oracle");
    assert_eq!(eps.len(), 6);
    for e in &eps {
        assert_eq!(e["success"], true, "{e}");
        assert_eq!(e["infra"], false, "{e}");
        assert!(e["instance"].as_str().unwrap().starts_with("i-"), "{e}");
        assert_eq!(e["perturbations"].as_array().unwrap().len(), 0);
    }
    // Every episode is its own instance.
    let ids: std::collections::BTreeSet<&str> = eps
        .iter()
        .map(|e| e["instance"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 6);

    // The random agent on the archive-logs template: domain randomisation, certified instances.
    let template = concat!(env!("CARGO_MANIFEST_DIR"), "/templates/archive-logs.toml");
    std::fs::write(
        &cfg,
        format!(
            "[experiment]\nname = \"random\"\nseeds = [1, 2]\nout_dir = \"{}\"\n\
             [environment]\ntemplate = \"{template}\"\nepisodes = 4\nworkers = 2\nmax_steps = 4\n\
             [reward]\nmode = \"sparse\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let o = engine_in(&st)
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = read_json(&dir.path().join("random/report.json"));
    assert_eq!(report["agent"], "random");
    assert_eq!(report["reward"]["mode"], "sparse");
    for s in report["seeds"].as_array().unwrap() {
        assert_eq!(s["episodes"], 4);
        let rate = s["success_rate"].as_f64();
        // Null only when every episode was skipped or failed.
        if let Some(r) = rate {
            assert!((0.0..=1.0).contains(&r), "{s}");
        }
    }
    let eps = episodes("random");
    assert_eq!(eps.len(), 8);
    for e in &eps {
        let skipped = e["skipped_uncertified"].as_bool().unwrap()
            || e["skipped_not_applicable"].as_bool().unwrap();
        let steps = e["steps"].as_u64().unwrap();
        assert!(steps <= 4, "{e}");
        if skipped {
            assert_eq!(steps, 0, "a skipped instance is never run: {e}");
        }
        // Sparse: the goal (1) once, -0.01 per step times one plus the action's declared
        // extra cost (archive-logs' recovery actions declare up to 2).
        let r = e["return"].as_f64().unwrap();
        let k = steps as f64;
        let goal = if e["success"].as_bool().unwrap() {
            1.0
        } else {
            0.0
        };
        assert!(
            r <= goal - 0.01 * k + 1e-9 && r >= goal - 0.03 * k - 1e-9,
            "sparse return: {e}"
        );
    }
    // The plans come from the template: seed * 1_000_003 + episode.
    assert_eq!(eps[0]["plan_seed"], 1_000_003);
    assert_eq!(eps[7]["plan_seed"], 2 * 1_000_003 + 3);

    // A broken config names the file, line and key.
    std::fs::write(&cfg, "[experiment]\nname = \"x\"\nseeds = [1]\nbogus = 1\n[environment]\ntask = \"archive-logs\"\nepisodes = 1\n").unwrap();
    let o = engine_in(&st)
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("exp.toml:4:1: unknown field `bogus`"), "{err}");
    std::fs::write(&cfg, "[experiment]\nname = \"x\"\nseeds = [1]\n[environment]\ntemplate = \"nowhere.toml\"\nepisodes = 1\n").unwrap();
    let o = engine_in(&st)
        .args(["run", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("exp.toml:5:1: key `environment.template`: no template file at"),
        "{err}"
    );
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
        "create_first_exec_cloned",
        "exec_sh_true",
        "reset_100_files",
        "snapshot_100_files",
        "rollback",
        "idle_rss_kib",
        "idle_pss_kib",
        "idle_private_kib",
        "one_shot_exec",
        "one_shot_daemon",
    ] {
        let m = v[k]["median"].as_f64().unwrap_or(f64::NAN);
        assert!(m > 0.0, "{k}: {m}");
        assert!(v[k]["p90"].as_f64().unwrap() >= m, "{k}");
    }
    assert!(v["ratios"]["exec_vs_host"].as_f64().unwrap() > 0.0);
    // Which program the one-shots ran, and how it is linked (`cargo build`'s front: glibc).
    let client = &v["one_shot_client"];
    assert!(
        client["program"]
            .as_str()
            .is_some_and(|p| p.ends_with("/engine")),
        "{client}"
    );
    assert_eq!(client["linkage"]["dynamic"], true, "{client}");
    assert_eq!(client["linkage"]["position_independent"], true, "{client}");
    // The daemon it started for the served one-shots is gone.
    let daemons: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains("envfactory-bench-daemon-"))
        .collect();
    assert!(daemons.is_empty(), "{daemons:?}");
}

/// `engine bench serve`, tiny: the report's shape, the sessions held (each answered, the
/// server's own count), the same instance both ways, the resets under both pool policies
/// (the servers' own counts: every timed reset cold under `last`, warm under `instance`); and
/// the servers it started are gone.
#[test]
fn bench_serve_reports_both_latencies_and_holds_the_sessions() {
    let st = State::new();
    if !is_root() {
        return;
    }
    let o = engine_in(&st)
        .args([
            "bench",
            "serve",
            "--json",
            "--sessions",
            "12",
            "--steps",
            "8",
            "--resets",
            "6",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let r = &v["resets"];
    assert_eq!(
        (r["last"]["n"].clone(), r["instance"]["n"].clone()),
        (6.into(), 6.into()),
        "{r}"
    );
    // 2 resets to fill each pool, then 2 warm-up and 6 timed ones.
    assert_eq!(r["last_counts"], serde_json::json!([0, 10]), "{r}");
    assert_eq!(r["instance_counts"], serde_json::json!([8, 2]), "{r}");
    assert!(r["ratio_p50"].as_f64().unwrap() > 0.0);
    for k in ["in_process", "server"] {
        assert_eq!(v[k]["n"], 8, "{k}: {v}");
        let p50 = v[k]["p50"].as_f64().unwrap();
        assert!(
            p50 > 0.0 && v[k]["p99"].as_f64().unwrap() >= p50,
            "{k}: {v}"
        );
    }
    for k in ["overhead_p50_ms", "overhead_p99_ms", "ratio_p50"] {
        assert!(v[k].as_f64().is_some(), "{k}: {v}");
    }
    assert!(v["instance"].as_str().unwrap().starts_with("i-"));
    let s = &v["sessions"];
    assert_eq!(s["requested"], 12);
    assert_eq!(s["held"], 12, "{v}");
    assert_eq!(
        s["server_active_sessions"], 13,
        "the stepping session and the 12 held"
    );
    assert!(s["rss_after_kib"].as_u64().unwrap() > 0);
    assert!(v["machine"]["cpus"].as_u64().unwrap() >= 1);
    // The server process tore its sandboxes down: no mount of this state directory is left.
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let runs = st.path().join("runs");
    assert!(
        !mounts.contains(runs.to_str().unwrap()),
        "mounts left under {}",
        runs.display()
    );
}

#[test]
fn admission_control_stops_bench_sandbox_concurrent_and_says_where() {
    if !is_root() {
        return;
    }
    let o = engine()
        .env("ENVFACTORY_MAX_SANDBOXES", "3")
        .args([
            "bench",
            "sandbox",
            "--json",
            "--iterations",
            "1",
            "--concurrent",
            "5",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = &v["concurrent"];
    assert_eq!(c["requested"], 5, "{c}");
    assert_eq!(c["sandboxes"], 3, "{c}");
    assert_eq!(c["answered"], 3, "{c}");
    let why = c["stopped"].as_str().unwrap();
    assert!(
        why.starts_with("stopped after 3 sandboxes: admission control refused a new sandbox: 3 sandboxes are alive"),
        "{why}"
    );
    for (var, value) in [
        ("ENVFACTORY_MAX_SANDBOXES", "0"),
        ("ENVFACTORY_MEMORY_RESERVE", "95%"),
        ("ENVFACTORY_MEMORY_RESERVE", "lots"),
    ] {
        let o = engine()
            .env(var, value)
            .args(["sandbox", "exec", "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{var}={value}: {err}");
        assert!(err.starts_with(&format!("engine: {var}: ")), "{err}");
    }
}

fn json_lines(out: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

#[test]
fn episode_with_the_oracle_prints_a_line_per_step_and_succeeds() {
    let st = State::new();
    if !is_root() {
        return;
    }
    let o = engine_in(&st)
        .args([
            "episode",
            "--task",
            "archive-logs",
            "--seed",
            "5",
            "--agent",
            "oracle",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = json_lines(&o.stdout);
    let last = lines.last().unwrap();
    assert_eq!(last["success"], true, "{last}");
    assert_eq!(last["task"], "archive-logs");
    assert!(last["instance"].as_str().unwrap().starts_with("i-"));
    let steps = &lines[..lines.len() - 1];
    assert_eq!(steps.len() as u64, last["steps"].as_u64().unwrap());
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(s["step"], i as u64 + 1);
        for k in ["action", "exit", "reward", "done"] {
            assert!(s.get(k).is_some(), "{k} missing in {s}");
        }
    }
    assert_eq!(steps.last().unwrap()["done"], true);
}

/// `engine episode ... | head -1`: the reader goes away after one line; the episode still ends
/// normally (no panic on the broken pipe) and tears its sandbox down.
#[test]
fn a_closed_stdout_stops_the_output_not_the_cleanup() {
    use std::io::BufRead;
    let st = State::new();
    if !is_root() {
        return;
    }
    let mut child = engine_in(&st)
        .args([
            "episode",
            "--task",
            "archive-logs",
            "--seed",
            "3",
            "--agent",
            "random",
            "--json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert!(first.contains("\"step\":1"), "{first}");
    // The reader is dropped here: every later line meets a closed pipe.
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}: {err}", o.status);
    assert!(!err.contains("panicked"), "{err}");
    let runs = st.dir.path().join("runs");
    let left: Vec<_> = std::fs::read_dir(&runs)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "run directories left behind: {left:?}");
}

#[test]
fn episode_from_an_actions_file_and_its_errors() {
    let st = State::new();
    if !is_root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("actions.txt");
    std::fs::write(&f, "# a comment\n@0\necho hi\n").unwrap();
    let o = engine_in(&st)
        .args([
            "episode",
            "--task",
            "archive-logs",
            "--json",
            "--actions-file",
        ])
        .arg(&f)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let lines = json_lines(&o.stdout);
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[1]["action"], "echo hi");
    assert_eq!(lines[2]["success"], false);
    // A bad line names the file and line.
    std::fs::write(&f, "ls\n@x\n").unwrap();
    let o = engine_in(&st)
        .args(["episode", "--task", "archive-logs", "--actions-file"])
        .arg(&f)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("actions.txt:2"), "{err}");
    // An unknown task or perturbation names what is known.
    let o = engine_in(&st)
        .args(["episode", "--task", "nope"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("archive-logs"));
    let o = engine_in(&st)
        .args([
            "episode",
            "--task",
            "archive-logs",
            "--perturb",
            "no-such-fault",
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no-such-fault"));
}

#[test]
fn task_check_certifies_the_unperturbed_task_and_list_names_tasks() {
    let st = State::new();
    if !is_root() {
        return;
    }
    let o = engine_in(&st).args(["task", "list"]).output().unwrap();
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("archive-logs"));
    let o = engine_in(&st)
        .args([
            "task",
            "check",
            "archive-logs",
            "--perturbations",
            "none",
            "--seeds",
            "2",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rows = json_lines(&o.stdout);
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["status"], "solvable", "{r}");
    }
}

#[test]
fn play_reads_commands_from_the_terminal() {
    let st = State::new();
    if !is_root() {
        return;
    }
    use std::io::Write;
    let mut child = engine_in(&st)
        .args(["play", "--task", "archive-logs", "--seed", "2"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b":actions\necho played-here\n:verify\n:quit\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success());
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(":0"), "{out}");
    assert!(out.contains("played-here"), "{out}");
    assert!(out.contains("verifier: not solved"), "{out}");
}

/// `docs/environments.md` embeds the catalogue and the task list as the engine prints them.
#[test]
fn environments_doc_tables_are_current() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/environments.md"))
        .unwrap();
    let between = |a: &str, b: &str| {
        let i = doc.find(a).unwrap() + a.len();
        let j = doc.find(b).unwrap();
        doc[i..j].trim().to_string()
    };
    let o = engine()
        .args(["perturb", "list", "--markdown"])
        .output()
        .unwrap();
    assert!(o.status.success());
    assert_eq!(
        between("<!-- catalogue:begin -->", "<!-- catalogue:end -->"),
        String::from_utf8_lossy(&o.stdout).trim(),
        "docs/environments.md: regenerate the catalogue with `engine perturb list --markdown`"
    );
    let tasks = between("<!-- tasks:begin -->", "<!-- tasks:end -->");
    for t in engine::tasks::names() {
        assert!(
            tasks.contains(&format!("`{t}`")),
            "task {t} missing in docs/environments.md"
        );
    }
}

#[test]
fn synth_prints_ids_and_plans_and_is_reproducible() {
    if !is_root() {
        return;
    }
    let st = State::new();
    let run = || {
        let o = engine_in(&st)
            .args([
                "synth",
                "templates/archive-logs.yaml",
                "--seed",
                "11",
                "--count",
                "3",
                "--json",
            ])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let a = run();
    let b = run();
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["instances"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(&a).len(), 3);
    assert_eq!(ids(&a), ids(&b), "same template and seeds, same instances");
    assert_eq!(a["instances"][0]["origin"], "Built");
    assert_eq!(b["instances"][0]["origin"], "Cached");
    assert_eq!(a["instances"][0]["seed"], 11);
    // A broken template names the file, line and key.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("bad.toml");
    std::fs::write(
        &f,
        "[template]\nname = \"x\"\n[base_environment]\nrootfs = \"host\"\n[[perturbation_space]]\nname = \"tool-missing\"\nprobability = 1.5\n",
    )
    .unwrap();
    let o = engine_in(&st).arg("synth").arg(&f).output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bad.toml:7"), "{err}");
    assert!(err.contains("probability"), "{err}");
}

#[test]
fn fingerprint_of_the_host_and_the_shipped_references() {
    let o = engine()
        .args([
            "fingerprint",
            "--shipped",
            "debootstrap-bookworm-minbase",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let shipped: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    if !is_root() {
        return;
    }
    let o = engine().args(["fingerprint", "--json"]).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let host: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // The same schema, and the host has more packages than a minbase rootfs.
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(keys(&host), keys(&shipped));
    assert_eq!(
        keys(&host["features"]),
        keys(&shipped["features"]),
        "same features"
    );
    let pkgs = |v: &serde_json::Value| v["features"]["dpkg_packages"].as_f64().unwrap();
    assert!(
        pkgs(&host) > pkgs(&shipped),
        "the host has more packages than minbase"
    );
}

/// The front hands a command line over as `execve` does: the same process, arguments
/// (`argv[0]` too), environment and signal mask, plus its build for the engine program. Here
/// the "engine program" beside a copy of the front is Python, which reports what it got.
#[test]
fn the_front_hands_over_with_the_same_pid_arguments_environment_and_signal_mask() {
    // The interpreter itself (`python3` on PATH may be a launcher script that reads argv[0]).
    let Some(python) = Command::new("python3")
        .args([
            "-c",
            "import os, sys; print(os.path.realpath(sys.executable))",
        ])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    else {
        eprintln!("skipped: no python3");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let front = dir.path().join("engine");
    std::fs::copy(env!("CARGO_BIN_EXE_engine"), &front).unwrap();
    std::os::unix::fs::symlink(&python, dir.path().join("engine-core")).unwrap();
    let script = "import json, os; s = open('/proc/self/status').read(); \
                  print(json.dumps({'cmdline': open('/proc/self/cmdline').read().split('\\0')[:-1], \
                  'pid': os.getpid(), 'var': os.environ.get('HANDED_OVER_TEST'), \
                  'build': os.environ.get('ENVFACTORY_FRONT_BUILD'), \
                  'blocked': [l.split()[1] for l in s.splitlines() if l.startswith('SigBlk:')][0]}))";
    let mut c = Command::new(&front);
    use std::os::unix::process::CommandExt;
    c.arg0("my-engine")
        .args(["-c", script])
        .env("HANDED_OVER_TEST", "kept");
    // SAFETY: sigprocmask on the child's own thread between fork and exec (async-signal-safe).
    unsafe {
        c.pre_exec(|| {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGUSR1);
            if libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = common::spawn(c.stdout(std::process::Stdio::piped()));
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{o:?}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        v["cmdline"],
        serde_json::json!(["my-engine", "-c", script]),
        "{v}"
    );
    assert_eq!(v["pid"], pid, "{v}");
    assert_eq!(v["var"], "kept", "{v}");
    let build = Command::new(&front).arg("__front-build").output().unwrap();
    assert_eq!(
        v["build"].as_str().map(str::to_string),
        Some(String::from_utf8_lossy(&build.stdout).trim().to_string()),
        "{v}"
    );
    let blocked = u64::from_str_radix(v["blocked"].as_str().unwrap(), 16).unwrap();
    assert_eq!(blocked, 1 << (libc::SIGUSR1 - 1), "{v}");
}

/// Without /proc (a mount namespace that unmounted it), the front finds the engine program
/// beside the path it was run by.
#[test]
fn the_front_hands_over_without_proc() {
    if !is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let o = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg("umount -l /proc && test ! -e /proc/self && exec \"$ENGINE\" --version")
        .env("ENGINE", env!("CARGO_BIN_EXE_engine"))
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.starts_with("engine "), "{o:?}");
}
